#include "trainer/config/lr_schedule.h"

#include <cmath>
#include <numbers>

#include <gtest/gtest.h>

namespace dsactor::trainer {
namespace {

// Expected values below are written out from DeepSpeed's lr_schedules.py formulas:
//   WarmupLR:       lr = min + (max - min) * gamma, gamma = log(it + 1) / log(W) (log) or
//                   it / W (linear) while it < W, else 1; W = max(2, warmup_num_steps).
//   WarmupDecayLR:  after warmup gamma = max(0, (T - it) / max(1, T - W)).
//   WarmupCosineLR: ratio = wmin + r * (1 - wmin) in warmup; after it,
//                   p = min(1, (it - W + 1) / max(1, T - W)),
//                   ratio = max(0, cmin + (1 - cmin) * (1 + cos(pi p)) / 2); lr = base * ratio.
// `it` is last_batch_iteration; learning_rate(step) = scheduled_lr(step - 1).

SchedulerConfig warmup_lr(double min_lr, double max_lr, int64_t steps, WarmupType type) {
  SchedulerConfig s;
  s.type = SchedulerType::kWarmupLR;
  s.warmup_min_lr = min_lr;
  s.warmup_max_lr = max_lr;
  s.warmup_num_steps = steps;
  s.warmup_type = type;
  return s;
}

TEST(LrSchedule, NoSchedulerIsTheOptimizerLr) {
  SchedulerConfig s;
  for (int64_t step : {0, 1, 1000}) EXPECT_EQ(learning_rate(s, 3e-4, step), 3e-4);
}

TEST(LrSchedule, WarmupLRLogByHand) {
  const auto s = warmup_lr(0.0, 0.01, 10, WarmupType::kLog);
  // Freshly constructed (it = -1) DeepSpeed reports min_lr; it = 0 gives log(1) = 0.
  EXPECT_EQ(learning_rate(s, 1.0, 0), 0.0);
  EXPECT_EQ(learning_rate(s, 1.0, 1), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 2), 0.01 * std::log(2.0) / std::log(10.0));
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 5), 0.01 * std::log(5.0) / std::log(10.0));
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 10), 0.01 * std::log(10.0) / std::log(10.0));
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 11), 0.01);  // it = 10 = W: warmup over
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 5000), 0.01);
}

TEST(LrSchedule, WarmupLRLinearByHand) {
  const auto s = warmup_lr(0.001, 0.011, 4, WarmupType::kLinear);
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 0), 0.001);
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 1), 0.001);             // it 0
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 2), 0.001 + 0.01 / 4);  // it 1
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 4), 0.001 + 0.01 * 3 / 4);
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 5), 0.011);
}

TEST(LrSchedule, WarmupLRWithoutMaxUsesTheOptimizerLr) {
  SchedulerConfig s = warmup_lr(0.0, 0.0, 2, WarmupType::kLinear);
  s.warmup_max_lr.reset();
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.5, 100), 0.5);
  s.type = SchedulerType::kWarmupDecayLR;  // its constructor default is 0.001 instead
  s.total_num_steps = 1000;
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.5, 3), 0.001 * (1000.0 - 2) / (1000 - 2));
}

TEST(LrSchedule, WarmupNumStepsIsAtLeastTwo) {
  const auto s = warmup_lr(0.0, 1.0, 1, WarmupType::kLinear);
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 2), 0.5);  // it 1 of W = 2
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 3), 1.0);
}

TEST(LrSchedule, WarmupLRIsMonotoneAndReachesMaxAtWarmupEnd) {
  const auto s = warmup_lr(1e-5, 1e-3, 100, WarmupType::kLog);
  double prev = -1;
  for (int64_t step = 0; step <= 101; ++step) {
    const double lr = learning_rate(s, 1.0, step);
    EXPECT_GE(lr, prev) << step;
    EXPECT_LE(lr, 1e-3 + 1e-18);
    prev = lr;
  }
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 101), 1e-3);
}

TEST(LrSchedule, WarmupDecayLRByHand) {
  SchedulerConfig s = warmup_lr(0.0, 0.1, 10, WarmupType::kLinear);
  s.type = SchedulerType::kWarmupDecayLR;
  s.total_num_steps = 30;
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 6), 0.1 * 5 / 10);    // it 5, warmup
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 11), 0.1 * 20 / 20);  // it 10: (30-10)/(30-10)
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 21), 0.1 * 10 / 20);  // it 20
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 31), 0.0);            // it 30 = total
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 100), 0.0);           // clamped at 0
  double prev = 1;
  for (int64_t step = 11; step <= 40; ++step) {
    EXPECT_LE(learning_rate(s, 1.0, step), prev);
    prev = learning_rate(s, 1.0, step);
  }
}

TEST(LrSchedule, WarmupCosineLRByHand) {
  SchedulerConfig s;
  s.type = SchedulerType::kWarmupCosineLR;
  s.total_num_steps = 20;
  s.warmup_num_steps = 4;
  s.warmup_type = WarmupType::kLinear;
  s.warmup_min_ratio = 0.1;
  s.cos_min_ratio = 0.01;
  const double base = 0.5;
  EXPECT_EQ(learning_rate(s, base, 0), 0.0);  // DeepSpeed's get_lr before the first step()
  EXPECT_DOUBLE_EQ(learning_rate(s, base, 1), base * 0.1);                // it 0
  EXPECT_DOUBLE_EQ(learning_rate(s, base, 3), base * (0.1 + 0.5 * 0.9));  // it 2
  // it 4 = W: p = 1/16.
  const double c1 = (1 + std::cos(std::numbers::pi / 16)) / 2;
  EXPECT_DOUBLE_EQ(learning_rate(s, base, 5), base * (0.01 + 0.99 * c1));
  // it 11: p = 8/16 -> cos part 0.5.
  EXPECT_DOUBLE_EQ(learning_rate(s, base, 12), base * (0.01 + 0.99 * 0.5));
  // it 19: p = 1 -> cos_min_ratio * lr, and it stays there.
  EXPECT_DOUBLE_EQ(learning_rate(s, base, 20), base * 0.01);
  EXPECT_DOUBLE_EQ(learning_rate(s, base, 500), base * 0.01);
}

TEST(LrSchedule, WarmupCosineLRLogWarmupAndShape) {
  SchedulerConfig s;
  s.type = SchedulerType::kWarmupCosineLR;
  s.total_num_steps = 600;
  s.warmup_num_steps = 50;
  s.warmup_type = WarmupType::kLog;
  s.warmup_min_ratio = 0.0;
  s.cos_min_ratio = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(s, 3e-3, 8), 3e-3 * std::log(8.0) / std::log(50.0));
  double prev = -1;
  for (int64_t step = 0; step <= 50; ++step) {
    EXPECT_GE(learning_rate(s, 3e-3, step), prev);
    prev = learning_rate(s, 3e-3, step);
  }
  // Peak right after warmup, then non-increasing down to cos_min_ratio * lr.
  EXPECT_NEAR(learning_rate(s, 3e-3, 51), 3e-3, 3e-3 * 1e-4);
  for (int64_t step = 52; step <= 700; ++step) {
    EXPECT_LE(learning_rate(s, 3e-3, step), prev + 1e-18);
    prev = learning_rate(s, 3e-3, step);
  }
  EXPECT_DOUBLE_EQ(learning_rate(s, 3e-3, 600), 3e-3 * 0.1);
}

}  // namespace
}  // namespace dsactor::trainer
