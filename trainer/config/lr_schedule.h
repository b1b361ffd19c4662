#pragma once
// DeepSpeed's learning-rate schedules (deepspeed/runtime/lr_schedules.py: WarmupLR,
// WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest) as pure functions of the step
// count, so every process (trainer, coordinator, offload service) computes the same lr
// without sharing a scheduler object.
#include <array>
#include <cstdint>

#include "trainer/config/ds_config.h"

namespace dsactor::trainer {

// What DeepSpeed's scheduler object returns from get_lr() when its last_batch_iteration is
// `iteration` (-1 = just constructed). base_lr is the optimizer's lr (optimizer.params.lr):
// WarmupCosineLR scales it, WarmupLR uses it when warmup_max_lr is not given.
double scheduled_lr(const SchedulerConfig& s, double base_lr, int64_t iteration);

// The lr of the next optimizer step after `step` applied optimizer steps (0 for the first
// step). DeepSpeed constructs the scheduler at last_batch_iteration (-1 by default), which
// at -1 sets the lr of the first step (at any other value the first step keeps the
// optimizer's lr), and calls scheduler.step() after every optimizer step that was not
// skipped for fp16 overflow; so step k >= 1 uses scheduled_lr(s, base_lr,
// last_batch_iteration + k). Skipped (overflow) steps must not be counted in `step`.
// Without a scheduler: base_lr.
double learning_rate(const SchedulerConfig& s, double base_lr, int64_t step);

// The optimizer's (beta1, beta2) for the step after `step` applied steps: `betas` (the
// optimizer's own), except under OneCycle with cycle_momentum, which sets beta1 from its
// momentum cycle and beta2 to 0.99 (cycle_min_mom at construction, as DeepSpeed does).
std::array<double, 2> scheduled_betas(const SchedulerConfig& s, std::array<double, 2> betas,
                                      int64_t step);

}  // namespace dsactor::trainer
