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

double warmup_lr(const SchedulerConfig& s, double base_lr, int64_t iteration) {
  // DeepSpeed clamps the warmup to at least 2 steps so that log(warmup) is not 0.
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);
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

double warmup_cosine_lr(const SchedulerConfig& s, double base_lr, int64_t iteration) {
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);
  if (iteration < 0) return 0.0;
  if (iteration < warmup) {
    const double r = warmup_gamma(s.warmup_type, warmup, iteration);
    return base_lr * (s.warmup_min_ratio + r * (1.0 - s.warmup_min_ratio));
  }
  const double real_last = static_cast<double>(iteration - warmup + 1);
  const double real_total = static_cast<double>(std::max<int64_t>(1, s.total_num_steps - warmup));
  // Clamped like current DeepSpeed, so the lr stays at the floor past total_num_steps.
  const double progress = std::min(1.0, real_last / real_total);
  const double cos_part = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
  return base_lr * std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cos_part);
}

// OneCycle's shape, as its constructor (_initialize_cycle) derives it.
struct Cycle {
  double first, second, total, step_ratio;
  int64_t first_stairs, second_stairs;
};

Cycle cycle_of(const SchedulerConfig& s) {
  Cycle c{};
  c.first = static_cast<double>(s.cycle_first_step_size);
  c.second = static_cast<double>(s.cycle_second_step_size.value_or(s.cycle_first_step_size));
  c.total = c.first + c.second;
  c.step_ratio = c.first / c.total;
  c.first_stairs = s.cycle_first_stair_count;
  c.second_stairs = s.cycle_second_stair_count.value_or(s.cycle_first_stair_count);
  return c;
}

// OneCycle._get_scale_factor: where in the cycle the batch after `iteration` is, 0 at the
// cycle's ends and 1 at its peak, quantised to whole stairs when a stair count is set.
double cycle_scale(const Cycle& c, int64_t iteration) {
  const double batch = static_cast<double>(iteration + 1);
  const double cycle = std::floor(1.0 + batch / c.total);
  const double x = 1.0 + batch / c.total - cycle;
  double scale = 0;
  int64_t stairs = 0;
  if (x <= c.step_ratio) {
    scale = x / c.step_ratio;
    stairs = c.first_stairs;
  } else {
    scale = (x - 1.0) / (c.step_ratio - 1.0);
    stairs = c.second_stairs;
  }
  if (stairs > 0) {
    const double in_cycle = std::fmod(batch, c.total);
    const double position = in_cycle <= c.first
                                ? in_cycle * static_cast<double>(stairs) / c.first
                                : (c.total - in_cycle) * static_cast<double>(stairs) / c.second;
    scale = std::floor(position) / static_cast<double>(stairs);
  }
  return scale;
}

double one_cycle_lr(const SchedulerConfig& s, int64_t iteration) {
  const Cycle c = cycle_of(s);
  if (static_cast<double>(iteration) < c.total)
    return s.cycle_min_lr + (s.cycle_max_lr - s.cycle_min_lr) * cycle_scale(c, iteration);
  // After the cycle (_get_decay_lr); decay is off when either the step size or the rate is 0.
  if (s.decay_step_size == 0 || s.decay_lr_rate == 0) return s.cycle_min_lr;
  const double decay_iteration = static_cast<double>(iteration) - c.total + 1.0;
  const double interval = decay_iteration / static_cast<double>(s.decay_step_size);
  return s.cycle_min_lr / (1.0 + s.decay_lr_rate * interval);
}

// OneCycle's momentum: beta1 cycles inversely to the lr and beta2 is 0.99
// (_initialize_momentum pairs every momentum with 0.99).
constexpr double kOneCycleBeta2 = 0.99;

double one_cycle_beta1(const SchedulerConfig& s, int64_t iteration) {
  const Cycle c = cycle_of(s);
  if (static_cast<double>(iteration) < c.total)
    return s.cycle_max_mom - (s.cycle_max_mom - s.cycle_min_mom) * cycle_scale(c, iteration);
  if (s.decay_step_size == 0 || s.decay_mom_rate == 0) return s.cycle_max_mom;
  const double decay_iteration = static_cast<double>(iteration) - c.total + 1.0;
  const double interval = decay_iteration / static_cast<double>(s.decay_step_size);
  return s.cycle_max_mom * (1.0 + s.decay_mom_rate * interval);
}

double lr_range_test_lr(const SchedulerConfig& s, int64_t iteration) {
  double interval =
      static_cast<double>(iteration + 1) / static_cast<double>(s.lr_range_test_step_size);
  if (s.lr_range_test_staircase) interval = std::floor(interval);
  return s.lr_range_test_min_lr * (1.0 + s.lr_range_test_step_rate * interval);
}

}  // namespace

double scheduled_lr(const SchedulerConfig& s, double base_lr, int64_t iteration) {
  switch (s.type) {
    case SchedulerType::kNone:
      return base_lr;
    case SchedulerType::kWarmupLR:
    case SchedulerType::kWarmupDecayLR:
      return warmup_lr(s, base_lr, iteration);
    case SchedulerType::kWarmupCosineLR:
      return warmup_cosine_lr(s, base_lr, iteration);
    case SchedulerType::kOneCycle:
      return one_cycle_lr(s, iteration);
    case SchedulerType::kLRRangeTest:
      return lr_range_test_lr(s, iteration);
  }
  return base_lr;
}

double learning_rate(const SchedulerConfig& s, double base_lr, int64_t step) {
  if (s.type == SchedulerType::kNone) return base_lr;
  // Constructed elsewhere than at -1, a DeepSpeed scheduler leaves the optimizer's lr alone
  // until its first step().
  if (step == 0 && s.last_batch_iteration != -1) return base_lr;
  return scheduled_lr(s, base_lr, s.last_batch_iteration + step);
}

std::array<double, 2> scheduled_betas(const SchedulerConfig& s, std::array<double, 2> betas,
                                      int64_t step) {
  if (s.type != SchedulerType::kOneCycle || !s.cycle_momentum) return betas;
  if (step == 0)  // construction at -1 sets the cycle's minimum momentum, not get_mom()'s
    return s.last_batch_iteration == -1 ? std::array<double, 2>{s.cycle_min_mom, kOneCycleBeta2}
                                        : betas;
  return {one_cycle_beta1(s, s.last_batch_iteration + step), kOneCycleBeta2};
}

}  // namespace dsactor::trainer
