#pragma once
// DeepSpeed's learning-rate schedules (deepspeed/runtime/lr_schedules.py) as pure functions
// of the step count, so every process (trainer, coordinator, offload service) computes the
// same lr without sharing a scheduler object.
#include <cstdint>

#include "trainer/config/ds_config.h"

namespace dsactor::trainer {

// What DeepSpeed's scheduler object returns from get_lr() when its last_batch_iteration is
// `iteration` (-1 = just constructed). base_lr is the optimizer's lr (optimizer.params.lr):
// WarmupCosineLR scales it, WarmupLR uses it when warmup_max_lr is not given.
double scheduled_lr(const SchedulerConfig& s, double base_lr, int64_t iteration);

// The lr of the next optimizer step after `step` applied optimizer steps (0 for the first
// step). DeepSpeed constructs the scheduler at last_batch_iteration = -1, which sets the lr
// of the first step, and calls scheduler.step() after every optimizer step that was not
// skipped for fp16 overflow; so this is scheduled_lr(s, base_lr, step - 1). Skipped
// (overflow) steps must not be counted in `step`. Without a scheduler: base_lr.
double learning_rate(const SchedulerConfig& s, double base_lr, int64_t step);

}  // namespace dsactor::trainer
