#pragma once
// The optimizer a ds_config names, applied to a model held whole in one process (the stage-0
// engine), and what offload services can run of it.
#include <cstdint>
#include <vector>

#include "kernels/cpu/adam.h"
#include "trainer/config/ds_config.h"
#include "trainer/model/param_blocks.h"

namespace dsactor::trainer {

// One optimizer step over every parameter: Adam/AdamW over each flat block (`adam` holds its
// hyper-parameters), or Lamb over each parameter tensor of each block (FusedLamb's trust
// ratio is per parameter tensor), with `lr` and, under OneCycle with cycle_momentum, the
// betas the schedule gives. `step` is the 1-based count of applied steps including this one;
// `grad_multiplier` is kernels::cpu::grad_multiplier's.
void local_optimizer_step(const DsConfig& config, const std::vector<BlockLayout>& layouts,
                          BlockSet& params, BlockSet& m, BlockSet& v, const BlockSet& grads,
                          const kernels::cpu::AdamHyper& adam, double lr, int64_t step,
                          float grad_multiplier);

// The partitions of ZeRO stages 1-3, on the ranks or in offload services, run Adam/AdamW
// with the betas fixed when they are created (DeepSpeed's CPU optimizer, which offload
// requires unless zero_force_ds_cpu_optimizer is false): throws ConfigError naming the key
// for Lamb and for OneCycle's momentum cycle.
void check_partitioned_optimizer(const DsConfig& config);

}  // namespace dsactor::trainer
