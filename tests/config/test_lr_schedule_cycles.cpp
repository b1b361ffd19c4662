// OneCycle and LRRangeTest against deepspeed/runtime/lr_schedules.py's formulas, worked out
// by hand below, at the phase boundaries, with DeepSpeed's off-by-one (construction at
// iteration -1 sets the first step's lr; step k uses iteration k - 1) and with another
// last_batch_iteration.
//   OneCycle:   b = it + 1, T = first + second, r = first / T, x = 1 + b/T - floor(1 + b/T);
//               scale = x / r when x <= r, else (x - 1) / (r - 1); with n stairs in that half,
//               scale = floor(pos) / n, pos = (b mod T) * n / first in the rising half, else
//               (T - b mod T) * n / second. lr = min + (max - min) * scale while it < T;
//               after: min / (1 + rate * (it - T + 1) / decay_step_size), or min without decay.
//               beta1 = max_mom - (max_mom - min_mom) * scale, beta2 = 0.99; after the cycle
//               max_mom * (1 + mom_rate * (it - T + 1) / decay_step_size); min_mom at
//               construction.
//   LRRangeTest: lr = min * (1 + rate * i), i = (it + 1) / step_size, floored with staircase.
#include <gtest/gtest.h>

#include "trainer/config/lr_schedule.h"

namespace dsactor::trainer {
namespace {

SchedulerConfig one_cycle(int64_t first, std::optional<int64_t> second = std::nullopt) {
  SchedulerConfig s;
  s.type = SchedulerType::kOneCycle;
  s.cycle_min_lr = 0.001;
  s.cycle_max_lr = 0.011;
  s.cycle_first_step_size = first;
  s.cycle_second_step_size = second;
  s.cycle_momentum = false;
  return s;
}

TEST(OneCycle, SymmetricCycleThenFlatWithoutDecay) {
  const auto s = one_cycle(4);                                      // T = 8, r = 0.5
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 0), 0.001);                // constructed: min
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 1), 0.001 + 0.01 * 0.25);  // it 0: x = 1/8
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 3), 0.001 + 0.01 * 0.75);  // it 2
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 4), 0.011);                // it 3: x = r, the peak
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 5), 0.001 + 0.01 * 0.75);  // it 4: falling
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 7), 0.001 + 0.01 * 0.25);  // it 6
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 8), 0.001);                // it 7: b = T, x = 0
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 9), 0.001);                // it 8 = T: after
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 100), 0.001);
}

TEST(OneCycle, AsymmetricStairsAndDecay) {
  auto s = one_cycle(4, 6);       // T = 10, r = 0.4
  s.cycle_first_stair_count = 2;  // the second half takes the first's count
  s.decay_step_size = 2;
  s.decay_lr_rate = 0.5;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0, 0), 0.001);          // pos 1*2/4 = 0.5 -> 0
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0, 1), 0.006);          // pos 1 -> 1/2
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0, 2), 0.006);          // pos 1.5 -> 1/2
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0, 3), 0.011);          // pos 2 -> 1: the peak
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0, 4), 0.006);          // falling: (10-5)*2/6 -> 1/2
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0, 6), 0.006);          // (10-7)*2/6 = 1 -> 1/2
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0, 7), 0.001);          // 2/3 -> 0
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0, 9), 0.001);          // last of the cycle
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0, 10), 0.001 / 1.25);  // decay: 1 step / 2 * 0.5
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0, 13), 0.001 / 2.0);   // 4 steps / 2 * 0.5
  s.decay_lr_rate = 0;                                     // a zero rate turns the decay off
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0, 13), 0.001);
}

TEST(OneCycle, MomentumCyclesBeta1AndSetsBeta2) {
  auto s = one_cycle(4);
  s.cycle_momentum = true;
  s.cycle_min_mom = 0.85;
  s.cycle_max_mom = 0.95;
  const std::array<double, 2> adam = {0.9, 0.999};
  auto beta1 = [&](int64_t step) { return scheduled_betas(s, adam, step)[0]; };
  EXPECT_EQ(scheduled_betas(s, adam, 0), (std::array<double, 2>{0.85, 0.99}));  // construction
  EXPECT_DOUBLE_EQ(beta1(1), 0.95 - 0.1 * 0.25);                                // it 0
  EXPECT_DOUBLE_EQ(beta1(4), 0.85);  // the lr's peak is the momentum's low
  EXPECT_DOUBLE_EQ(beta1(8), 0.95);  // it 7: back at the top
  EXPECT_DOUBLE_EQ(scheduled_betas(s, adam, 9)[1], 0.99);
  EXPECT_DOUBLE_EQ(beta1(50), 0.95);  // no decay
  s.decay_step_size = 2;
  s.decay_mom_rate = 0.1;
  EXPECT_DOUBLE_EQ(beta1(9), 0.95 * (1 + 0.1 * 0.5));  // it 8: 1 decay step
  s.cycle_momentum = false;
  EXPECT_EQ(scheduled_betas(s, adam, 5), adam);
  SchedulerConfig warm;
  warm.type = SchedulerType::kWarmupLR;
  EXPECT_EQ(scheduled_betas(warm, adam, 5), adam);
}

TEST(LRRangeTest, ContinuousAndStaircase) {
  SchedulerConfig s;
  s.type = SchedulerType::kLRRangeTest;
  s.lr_range_test_min_lr = 0.01;
  s.lr_range_test_step_size = 4;
  s.lr_range_test_step_rate = 0.5;
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 0), 0.01);  // constructed: min_lr
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 1), 0.01 * (1 + 0.5 * 1.0 / 4));
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 8), 0.01 * (1 + 0.5 * 8.0 / 4));
  s.lr_range_test_staircase = true;
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 3), 0.01);         // it 2: floor(3/4) = 0
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 4), 0.01 * 1.5);   // it 3: floor(4/4) = 1
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 8), 0.01 * 2.0);   // it 7: the stair's first step
  EXPECT_DOUBLE_EQ(learning_rate(s, 9.0, 11), 0.01 * 2.0);  // it 10: floor(11/4) = 2
}

TEST(LastBatchIteration, TheFirstStepKeepsTheOptimizersLrThenTheScheduleGoesOn) {
  SchedulerConfig s;
  s.type = SchedulerType::kWarmupLR;
  s.warmup_min_lr = 0;
  s.warmup_max_lr = 0.01;
  s.warmup_num_steps = 10;
  s.warmup_type = WarmupType::kLinear;
  s.last_batch_iteration = 4;
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.5, 0), 0.5);         // not constructed at -1
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.5, 1), 0.01 * 0.5);  // iteration 5
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.5, 6), 0.01);        // iteration 10: warm
  auto c = one_cycle(4);
  c.cycle_momentum = true;
  c.cycle_min_mom = 0.8;
  c.cycle_max_mom = 0.9;
  c.last_batch_iteration = 2;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0.5, 0), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 0.5, 1), 0.011);  // iteration 3: the peak
  EXPECT_EQ(scheduled_betas(c, {0.9, 0.999}, 0), (std::array<double, 2>{0.9, 0.999}));
  EXPECT_DOUBLE_EQ(scheduled_betas(c, {0.9, 0.999}, 1)[0], 0.8);
}

TEST(OneCycle, DeepSpeedsConstructorDefaults) {
  const DsConfig c = parse_ds_config(
      nlohmann::json::parse(R"({"train_batch_size": 1, "scheduler": {"type": "OneCycle",
          "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3}}})"),
      "one_cycle.json");
  const auto& s = c.scheduler;
  EXPECT_EQ(s.cycle_first_step_size, 2000);
  EXPECT_FALSE(s.cycle_second_step_size.has_value());
  EXPECT_EQ(s.cycle_first_stair_count, 0);
  EXPECT_EQ(s.decay_step_size, 0);
  EXPECT_TRUE(s.cycle_momentum);
  EXPECT_DOUBLE_EQ(s.cycle_min_mom, 0.8);
  EXPECT_DOUBLE_EQ(s.cycle_max_mom, 0.9);
  EXPECT_EQ(s.last_batch_iteration, -1);
  const DsConfig r = parse_ds_config(
      nlohmann::json::parse(R"({"train_batch_size": 1, "scheduler": {"type": "LRRangeTest"}})"),
      "range.json");
  EXPECT_DOUBLE_EQ(r.scheduler.lr_range_test_min_lr, 1e-3);
  EXPECT_EQ(r.scheduler.lr_range_test_step_size, 2000);
  EXPECT_DOUBLE_EQ(r.scheduler.lr_range_test_step_rate, 1.0);
  EXPECT_FALSE(r.scheduler.lr_range_test_staircase);
}

}  // namespace
}  // namespace dsactor::trainer
