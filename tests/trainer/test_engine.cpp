// Stage-0 engine: exact resume, fp16 overflow and skipped steps, bf16 rounding, gradient
// accumulation, and the scheduled lr. These runs are the reference every other mode is
// compared against, so they are checked bit for bit where the arithmetic allows.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "kernels/cpu/cast.h"
#include "tests/trainer/block_set_test_util.h"
#include "trainer/config/lr_schedule.h"
#include "trainer/data/batch_loader.h"
#include "trainer/engine/engine.h"
#include "trainer/rng.h"

namespace dsactor::trainer {
namespace {

namespace fs = std::filesystem;

const GptConfig kTiny{2, 2, 32, 64, 16};

std::vector<int32_t> corpus(size_t n, uint64_t seed) {
  // A learnable stream: a repeating pattern with a little noise.
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i)
    t[i] = static_cast<int32_t>((i * 7 + (i / 5) % 3) % 64 ^ (rng.next_u64() % 16 == 0 ? 1 : 0));
  return t;
}

DsConfig config(nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 4},
      {"gradient_accumulation_steps", 1},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}}};
  j.merge_patch(extra);
  return parse_ds_config(j, "test");
}

struct Run {
  std::vector<float> losses;
  std::vector<StepResult> steps;
};

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    omp_set_num_threads(2);
    dir_ = fs::temp_directory_path() /
           ("dsactor_engine_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(EngineTest, ResumeIsBitIdenticalToAStraightRun) {
  for (const char* mode : {"fp32", "fp16", "bf16"}) {
    SCOPED_TRACE(mode);
    nlohmann::json extra = nlohmann::json::object();
    if (std::string(mode) == "fp16")
      extra = {
          {"fp16", {{"enabled", true}, {"initial_scale_power", 12}, {"loss_scale_window", 2}}}};
    if (std::string(mode) == "bf16") extra = {{"bf16", {{"enabled", true}}}};
    extra["scheduler"] = {{"type", "WarmupCosineLR"},
                          {"params", {{"total_num_steps", 8}, {"warmup_num_steps", 3}}}};
    const DsConfig c = config(extra);
    const auto tokens = corpus(4000, 1);

    Engine straight(kTiny, c, 5);
    BatchLoader l1(&tokens, 4, 16, true, 9);
    std::vector<float> a;
    for (int i = 0; i < 8; ++i) a.push_back(straight.train_step(l1).loss);

    Engine first(kTiny, c, 5);
    BatchLoader l2(&tokens, 4, 16, true, 9);
    std::vector<float> b;
    for (int i = 0; i < 4; ++i) b.push_back(first.train_step(l2).loss);
    first.save_checkpoint(dir_ / mode, {{"cursor", l2.cursor()}});

    Engine second(kTiny, c, 999);  // different init: everything must come from the checkpoint
    const auto extra_state = second.load_checkpoint(dir_ / mode);
    BatchLoader l3(&tokens, 4, 16, true, 9);
    l3.restore(extra_state.at("cursor"));
    EXPECT_EQ(second.global_step(), 4);
    for (int i = 0; i < 4; ++i) b.push_back(second.train_step(l3).loss);

    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0)
          << "step " << i << ": " << a[i] << " vs " << b[i];
    EXPECT_TRUE(same_bits(straight.master_params(), second.master_params()));
    EXPECT_EQ(straight.loss_scaler().scale(), second.loss_scaler().scale());
  }
}

TEST_F(EngineTest, Fp16OverflowSkipsTheStepAndLowersTheScale) {
  // 2^40 times a unit-scale gradient cannot be held in fp16 (max 65504): overflow is certain.
  const DsConfig c =
      config({{"fp16", {{"enabled", true}, {"initial_scale_power", 40}, {"hysteresis", 1}}}});
  const auto tokens = corpus(4000, 2);
  Engine e(kTiny, c, 3);
  BatchLoader loader(&tokens, 4, 16, false, 0);
  BlockSet before = BlockSet::zeros(e.model().layouts());
  before.copy_from(e.master_params());
  const StepResult r = e.train_step(loader);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.loss_scale, std::ldexp(1.0, 40));
  EXPECT_EQ(e.loss_scaler().scale(), std::ldexp(1.0, 39));
  EXPECT_EQ(e.optimizer_steps(), 0);
  EXPECT_EQ(e.global_step(), 1);
  EXPECT_EQ(e.skipped_steps(), 1);
  EXPECT_TRUE(same_bits(before, e.master_params())) << "a skipped step changed the weights";
  // It keeps halving until the gradients fit, then steps for real.
  int skipped = 1;
  StepResult last;
  for (int i = 0; i < 40; ++i) {
    last = e.train_step(loader);
    if (!last.skipped) break;
    ++skipped;
  }
  EXPECT_FALSE(last.skipped);
  EXPECT_GT(skipped, 10);
  EXPECT_EQ(e.optimizer_steps(), 1);
  EXPECT_FALSE(same_bits(before, e.master_params()));
}

TEST_F(EngineTest, Bf16WorkingWeightsAreBf16Representable) {
  const DsConfig c = config({{"bf16", {{"enabled", true}}}});
  const auto tokens = corpus(4000, 3);
  Engine e(kTiny, c, 3);
  BatchLoader loader(&tokens, 4, 16, false, 0);
  for (int i = 0; i < 3; ++i) e.train_step(loader);
  bool master_has_low_bits = false;
  for (size_t b = 0; b < e.master_params().blocks.size(); ++b) {
    const auto& w = e.compute_params().blocks[b];
    const auto& m = e.master_params().blocks[b];
    for (size_t i = 0; i < w.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &w[i], 4);
      ASSERT_EQ(bits & 0xffffu, 0u) << "working weight not bf16 at block " << b << " index " << i;
      ASSERT_EQ(w[i], kernels::cpu::bf16_to_float(kernels::cpu::float_to_bf16(m[i])));
      std::memcpy(&bits, &m[i], 4);
      master_has_low_bits |= (bits & 0xffffu) != 0;
    }
  }
  EXPECT_TRUE(master_has_low_bits) << "the fp32 master should keep full precision";
}

TEST_F(EngineTest, GradientAccumulationMatchesOneBigMicroBatch) {
  const auto tokens = corpus(4000, 4);
  Engine big(kTiny,
             config({{"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 1}}),
             1);
  Engine acc(kTiny,
             config({{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", 2}}),
             1);
  // Same token order: 1 batch of 4 rows == 2 consecutive batches of 2 rows (llm.c order).
  BatchLoader lb(&tokens, 4, 16, false, 0), la(&tokens, 2, 16, false, 0);
  for (int i = 0; i < 5; ++i) {
    const float x = big.train_step(lb).loss, y = acc.train_step(la).loss;
    // Equal up to float summation order (per-row sums are grouped differently).
    EXPECT_NEAR(x, y, 1e-5 * std::abs(x)) << "step " << i;
  }
}

TEST_F(EngineTest, ScheduledLearningRateIsUsedEachStep) {
  const DsConfig c = config({{"scheduler",
                              {{"type", "WarmupLR"},
                               {"params",
                                {{"warmup_min_lr", 0.0},
                                 {"warmup_max_lr", 0.01},
                                 {"warmup_num_steps", 4},
                                 {"warmup_type", "linear"}}}}}});
  const auto tokens = corpus(4000, 5);
  Engine e(kTiny, c, 1);
  BatchLoader loader(&tokens, 4, 16, false, 0);
  // DeepSpeed sets the first step's lr at construction (iteration -1 -> warmup_min_lr) and
  // steps the scheduler after each applied step, so iteration 0 (gamma 0) is the second step.
  const double expected[] = {0.0, 0.0, 0.0025, 0.005, 0.0075, 0.01, 0.01};
  for (double lr : expected) EXPECT_DOUBLE_EQ(e.train_step(loader).lr, lr);
}

TEST_F(EngineTest, LossFallsOnALearnableStream) {
  const auto tokens = corpus(8000, 6);
  Engine e(kTiny, config(), 1);
  BatchLoader loader(&tokens, 4, 16, true, 1);
  const float first = e.train_step(loader).loss;
  float last = first;
  for (int i = 0; i < 40; ++i) last = e.train_step(loader).loss;
  EXPECT_LT(last, first - 1.0f) << first << " -> " << last;
}

TEST_F(EngineTest, RefusesWhatTheStageZeroEngineDoesNotRun) {
  EXPECT_THROW(Engine(kTiny, config({{"zero_optimization", {{"stage", 3}}}}), 1), ConfigError);
  EXPECT_THROW(Engine(kTiny,
                      config({{"zero_optimization",
                               {{"stage", 0}, {"offload_optimizer", {{"device", "cpu"}}}}}}),
                      1),
               ConfigError);
  try {
    Engine(kTiny, config({{"zero_optimization", {{"stage", 2}}}}), 1);
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.stage = 2 runs in the ZeRO engine"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(EngineTest, CheckpointOfAnotherModelShapeIsRefusedAndStateKept) {
  const auto tokens = corpus(4000, 7);
  Engine e(kTiny, config(), 1);
  BatchLoader loader(&tokens, 4, 16, false, 0);
  e.train_step(loader);
  e.save_checkpoint(dir_ / "ck", {});
  GptConfig other = kTiny;
  other.n_embd = 64;
  Engine f(other, config(), 1);
  BlockSet before = BlockSet::zeros(f.model().layouts());
  before.copy_from(f.master_params());
  EXPECT_THROW(f.load_checkpoint(dir_ / "ck"), std::runtime_error);
  EXPECT_TRUE(same_bits(before, f.master_params()));
  EXPECT_EQ(f.global_step(), 0);
}

}  // namespace
}  // namespace dsactor::trainer
