#pragma once
// ZeRO stages 1-3 without offload services: the data-parallel ranks hold the partitions
// themselves, as DeepSpeed does (trainer/README.md, "ZeRO on the trainers").
//
// LocalPartitions is, for the partitions of one rank, what an offload service is for the
// partitions placed on it: the fp32 master and both Adam moments of this rank's slice of
// every block (PartitionPlan), set once at version 0, updated by the step's commit with the
// same fused Adam pass and the same multiplier a service applies to a CommitStep, and read
// back as the forward reads them (rounded through the run's half type). The gradients it is
// committed with are the GradientPipeline's (this rank's reduced partitions, kept until the
// step's verdict), so a rank holds 1/W of the optimizer state and of the gradients; in
// stage 3 the model reads a block only while it is resident (ParamResidency gathers it).
//
// Threads: the engine's thread sets, commits, saves and loads; stage 3's fetcher reads
// between commits (the engine waits for every fetch in flight before it commits).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/adam.h"
#include "messages/codec.h"
#include "trainer/engine/engine.h"
#include "trainer/model/param_blocks.h"
#include "trainer/zero/partition_plan.h"

namespace dsactor::storage {
class CheckpointWriter;
class CheckpointReader;
}  // namespace dsactor::storage

namespace dsactor::trainer {

class LocalPartitions {
 public:
  LocalPartitions(const std::vector<BlockLayout>& layouts, const PartitionPlan& plan, uint32_t rank,
                  const kernels::cpu::AdamHyper& adam, Precision precision);
  LocalPartitions(const LocalPartitions&) = delete;
  LocalPartitions& operator=(const LocalPartitions&) = delete;

  // This rank's slice of block b's initial fp32 weights (the whole block's `values`).
  void set_parameters(size_t b, const float* values);
  // This rank's slice of block b (count floats) as the forward reads it: the master, rounded
  // through the half type in bf16/fp16. `version` must be the committed step: a forward
  // never mixes steps.
  void read(size_t b, uint64_t version, float* out) const;
  // The step's optimizer pass over every partition, in block order: Adam's `adam_t`-th
  // update with grad_multiplier(clip_coef, loss_scale) and the commit's lr, from `grads`
  // (per block this rank's reduced partition, at least count floats). The parameters are
  // at version commit.step afterwards.
  void commit(const messages::CommitStep& commit, int64_t adam_t, const BlockSet& grads);

  // Master, m and v of every slice as tensors params/<block>, adam_m/<block>,
  // adam_v/<block> (at world size 1 a slice is its block: the stage-0 checkpoint's tensors).
  void save(storage::CheckpointWriter& w) const;
  // Reads them into fresh buffers (checked: names, sizes, crc32c) and only then takes them
  // over at `version`, so a refused checkpoint leaves this rank's state as it was.
  void load(const storage::CheckpointReader& r, uint64_t version);

  uint64_t version() const { return version_.load(); }
  // fp32 master, m and v of this rank's slices: 1/W of stage 0's 12 bytes per parameter.
  size_t optimizer_state_bytes() const;

 private:
  const std::vector<BlockLayout>& layouts_;
  const PartitionPlan& plan_;
  uint32_t rank_;
  kernels::cpu::AdamHyper adam_;
  Precision precision_;
  // Per block this rank's slice (empty where it owns nothing of the block).
  BlockSet master_, m_, v_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace dsactor::trainer
