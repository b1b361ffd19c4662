#include "trainer/optimizer_step.h"

#include <fmt/format.h>

#include "kernels/cpu/lamb.h"
#include "trainer/config/lr_schedule.h"

namespace dsactor::trainer {
namespace k = dsactor::kernels::cpu;

namespace {

k::LambHyper lamb_hyper_of(const OptimizerConfig& o, const k::AdamHyper& adam) {
  k::LambHyper h;
  h.lr = adam.lr;
  h.beta1 = adam.beta1;
  h.beta2 = adam.beta2;
  h.eps = adam.eps;
  h.weight_decay = adam.weight_decay;
  h.bias_correction = adam.bias_correction;
  h.max_coeff = static_cast<float>(o.max_coeff);
  h.min_coeff = static_cast<float>(o.min_coeff);
  h.eps_inside_sqrt = o.eps_inside_sqrt;
  return h;
}

}  // namespace

void local_optimizer_step(const DsConfig& config, const std::vector<BlockLayout>& layouts,
                          BlockSet& params, BlockSet& m, BlockSet& v, const BlockSet& grads,
                          const k::AdamHyper& adam, double lr, int64_t step,
                          float grad_multiplier) {
  k::AdamHyper h = adam;
  h.lr = static_cast<float>(lr);
  const auto betas = scheduled_betas(config.scheduler, {h.beta1, h.beta2}, step - 1);
  h.beta1 = static_cast<float>(betas[0]);
  h.beta2 = static_cast<float>(betas[1]);
  if (config.optimizer.type != OptimizerType::kLamb) {
    for (size_t b = 0; b < params.blocks.size(); ++b)
      k::adam_step(params.blocks[b].data(), m.blocks[b].data(), v.blocks[b].data(),
                   grads.blocks[b].data(), params.blocks[b].size(), h, step, grad_multiplier);
    return;
  }
  const k::LambHyper lamb = lamb_hyper_of(config.optimizer, h);
  for (size_t b = 0; b < params.blocks.size(); ++b)
    for (const TensorSlot& t : layouts[b].tensors)
      k::lamb_step(params.blocks[b].data() + t.offset, m.blocks[b].data() + t.offset,
                   v.blocks[b].data() + t.offset, grads.blocks[b].data() + t.offset, t.numel, lamb,
                   step, grad_multiplier);
}

void check_partitioned_optimizer(const DsConfig& c) {
  if (c.optimizer.type == OptimizerType::kLamb)
    throw ConfigError(fmt::format(
        "{}: optimizer.type: Lamb runs at ZeRO stage 0 only: the partitions of stages 1-3 (held "
        "by the ranks or by offload services) run Adam/AdamW, as DeepSpeed's CPU optimizer "
        "does (DeepSpeed refuses Lamb with offload too, unless zero_force_ds_cpu_optimizer is "
        "false); use Adam or AdamW, or zero_optimization.stage 0",
        c.source));
  if (c.scheduler.type == SchedulerType::kOneCycle && c.scheduler.cycle_momentum)
    throw ConfigError(fmt::format(
        "{}: scheduler.params.cycle_momentum: OneCycle's momentum cycle changes the optimizer's "
        "betas every step, and the partitions of ZeRO stages 1-3 take the betas once, when "
        "they are created; set \"cycle_momentum\": false (its default is true) to run OneCycle "
        "at stages 1-3",
        c.source));
}

}  // namespace dsactor::trainer
