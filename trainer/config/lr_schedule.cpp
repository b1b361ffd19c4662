#include "trainer/config/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace dsactor::trainer {
namespace {

// Fraction of the warmup done at `iteration` (< warmup_steps), 0 at iteration 0.
double warmup_gamma(WarmupType type, int64_t warmup_steps, int64_t iteration) {
  if (type == WarmupType::kLinear)
    return static_cast<double>(iteration) / static_cast<double>(warmup_steps);
  return std::log(static_cast<double>(iteration + 1)) / std::log(static_cast<double>(warmup_steps));
}

}  // namespace

double scheduled_lr(const SchedulerConfig& s, double base_lr, int64_t iteration) {
  // DeepSpeed clamps the warmup to at least 2 steps so that log(warmup) is not 0.
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);
  switch (s.type) {
    case SchedulerType::kNone:
      return base_lr;
    case SchedulerType::kWarmupLR:
    case SchedulerType::kWarmupDecayLR: {
      const double max_lr =
          s.warmup_max_lr.value_or(s.type == SchedulerType::kWarmupLR ? base_lr : 0.001);
      const double min_lr = s.warmup_min_lr;
      if (iteration < 0) return min_lr;
      double gamma = 1.0;
      if (iteration < warmup) {
        gamma = warmup_gamma(s.warmup_type, warmup, iteration);
      } else if (s.type == SchedulerType::kWarmupDecayLR) {
        gamma = std::max(0.0, static_cast<double>(s.total_num_steps - iteration) /
                                  std::max(1.0, static_cast<double>(s.total_num_steps - warmup)));
      }
      return min_lr + (max_lr - min_lr) * gamma;
    }
    case SchedulerType::kWarmupCosineLR: {
      if (iteration < 0) return 0.0;
      if (iteration < warmup) {
        const double r = warmup_gamma(s.warmup_type, warmup, iteration);
        return base_lr * (s.warmup_min_ratio + r * (1.0 - s.warmup_min_ratio));
      }
      const double real_last = static_cast<double>(iteration - warmup + 1);
      const double real_total =
          static_cast<double>(std::max<int64_t>(1, s.total_num_steps - warmup));
      // Clamped like current DeepSpeed, so the lr stays at the floor past total_num_steps.
      const double progress = std::min(1.0, real_last / real_total);
      const double cos_part = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
      return base_lr * std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cos_part);
    }
  }
  return base_lr;
}

double learning_rate(const SchedulerConfig& s, double base_lr, int64_t step) {
  return scheduled_lr(s, base_lr, step - 1);
}

}  // namespace dsactor::trainer
