#include "trainer/config/loss_scaler.h"

#include <vector>

#include <gtest/gtest.h>

namespace dsactor::trainer {
namespace {

// Expected sequences are worked out by hand from DeepSpeed's DynamicLossScaler.update_scale:
// on overflow, if delayed_shift == 1 or cur_hysteresis == 1 the scale becomes
// max(scale / 2, min_scale) (error if already at min_scale), else cur_hysteresis -= 1;
// last_overflow_iter = cur_iter. Without overflow: consecutive_hysteresis refills the
// hysteresis; stable = cur_iter - last_overflow_iter - 1, and if stable > 0 and
// stable % scale_window == 0 the scale doubles (and a non-consecutive hysteresis refills).
// cur_iter += 1 in both cases. Each vector holds scale() after each update().

struct Trace {
  std::vector<double> scales;
  std::vector<int64_t> hysteresis;
};

Trace run(LossScaler& s, const std::vector<bool>& overflows) {
  Trace t;
  for (bool o : overflows) {
    s.update(o);
    t.scales.push_back(s.scale());
    t.hysteresis.push_back(s.cur_hysteresis());
  }
  return t;
}

TEST(LossScaler, HalvesOnlyAfterHysteresisIsExhausted) {
  auto s = LossScaler::dynamic_scaler(65536, 1000, 1, 2, false);
  const Trace t = run(s, {true, true, true});
  EXPECT_EQ(t.scales, (std::vector<double>{65536, 32768, 16384}));
  EXPECT_EQ(t.hysteresis, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(s.last_overflow_iter(), 2);
  EXPECT_EQ(s.cur_iter(), 3);
}

TEST(LossScaler, GrowsAfterScaleWindowCleanSteps) {
  auto s = LossScaler::dynamic_scaler(8, 3, 1, 2, false);
  // last_overflow_iter starts at -1, so the first doubling is at cur_iter 3 (4th update).
  EXPECT_EQ(run(s, std::vector<bool>(7, false)).scales,
            (std::vector<double>{8, 8, 8, 16, 16, 16, 32}));
}

TEST(LossScaler, WindowRestartsAtTheLastOverflow) {
  auto s = LossScaler::dynamic_scaler(8, 3, 1, 1, false);
  EXPECT_EQ(run(s, {false, true, false, false, false, false}).scales,
            (std::vector<double>{8, 4, 4, 4, 4, 8}));
}

TEST(LossScaler, NonConsecutiveHysteresisIsNotRefilledByOneCleanStep) {
  auto s = LossScaler::dynamic_scaler(1024, 1000, 1, 3, false);
  const Trace t = run(s, {true, false, true, true});
  EXPECT_EQ(t.scales, (std::vector<double>{1024, 1024, 1024, 512}));
  EXPECT_EQ(t.hysteresis, (std::vector<int64_t>{2, 2, 1, 1}));
}

TEST(LossScaler, ConsecutiveHysteresisRefillsAfterEveryCleanStep) {
  auto s = LossScaler::dynamic_scaler(1024, 1000, 1, 3, true);
  const Trace t = run(s, {true, false, true, true, true});
  EXPECT_EQ(t.scales, (std::vector<double>{1024, 1024, 1024, 1024, 512}));
  EXPECT_EQ(t.hysteresis, (std::vector<int64_t>{2, 3, 2, 1, 1}));
}

TEST(LossScaler, GrowthRefillsNonConsecutiveHysteresis) {
  auto s = LossScaler::dynamic_scaler(64, 2, 1, 2, false);
  const Trace t = run(s, {true, true, false, false, false, true});
  EXPECT_EQ(t.scales, (std::vector<double>{64, 32, 32, 32, 64, 64}));
  EXPECT_EQ(t.hysteresis, (std::vector<int64_t>{1, 1, 1, 1, 2, 1}));
}

TEST(LossScaler, MinScaleIsAFloorAndOverflowAtTheFloorStopsTheRun) {
  auto s = LossScaler::dynamic_scaler(4, 1000, 3, 1, false);
  s.update(true);
  EXPECT_EQ(s.scale(), 3);  // max(4 / 2, 3)
  EXPECT_THROW(s.update(true), LossScaleError);

  auto lenient = LossScaler::dynamic_scaler(4, 1000, 3, 1, false, /*raise=*/false);
  EXPECT_EQ(run(lenient, {true, true, true}).scales, (std::vector<double>{3, 3, 3}));
}

TEST(LossScaler, BuiltFromFp16Config) {
  Fp16Config fp16;
  fp16.enabled = true;
  fp16.loss_scale = 0;
  fp16.initial_scale_power = 16;
  fp16.loss_scale_window = 1000;
  fp16.hysteresis = 2;
  fp16.min_loss_scale = 1;
  LossScaler dyn(fp16);
  EXPECT_TRUE(dyn.dynamic());
  EXPECT_EQ(dyn.scale(), 65536);
  EXPECT_EQ(dyn.cur_hysteresis(), 2);
  EXPECT_EQ(dyn.last_overflow_iter(), -1);

  fp16.loss_scale = 128;
  LossScaler fixed(fp16);
  EXPECT_FALSE(fixed.dynamic());
  fixed.update(true);
  fixed.update(false);
  EXPECT_EQ(fixed.scale(), 128);

  fp16.enabled = false;  // bf16 / fp32: no scaling
  LossScaler none(fp16);
  EXPECT_FALSE(none.dynamic());
  EXPECT_EQ(none.scale(), 1);
}

TEST(LossScaler, StateRoundTripContinuesIdentically) {
  auto a = LossScaler::dynamic_scaler(1024, 3, 1, 2, false);
  run(a, {true, false, true, false, false});
  const auto text = a.state().dump();

  auto b = LossScaler::dynamic_scaler(1, 1000, 1, 5, true);
  b.restore(nlohmann::json::parse(text));
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.cur_iter(), a.cur_iter());
  EXPECT_EQ(b.last_overflow_iter(), a.last_overflow_iter());
  EXPECT_EQ(b.cur_hysteresis(), a.cur_hysteresis());
  const std::vector<bool> more = {false, false, true, true, false, false, false, false};
  const Trace ta = run(a, more);
  const Trace tb = run(b, more);
  EXPECT_EQ(ta.scales, tb.scales);
  EXPECT_EQ(ta.hysteresis, tb.hysteresis);
}

TEST(LossScaler, RestoreRejectsMismatchedOrIncompleteState) {
  auto dyn = LossScaler::dynamic_scaler(1024, 3, 1, 2, false);
  auto fixed = LossScaler::fixed(8);
  EXPECT_THROW(fixed.restore(dyn.state()), std::invalid_argument);
  auto st = dyn.state();
  st.erase("cur_iter");
  EXPECT_THROW(dyn.restore(st), std::invalid_argument);
  EXPECT_EQ(dyn.scale(), 1024);  // untouched after a failed restore
}

}  // namespace
}  // namespace dsactor::trainer
