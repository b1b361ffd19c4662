// ZeRO stages 1-3 without offload services, at one rank: the rank holds the fp32 master and
// Adam moments of its partitions itself (LocalPartitions), which at world size 1 are whole
// blocks. The gradients are the same kernels' in the same order, their sums of squares are
// grad_stats over the same floats, the multiplier the same function of the same two doubles
// and Adam the same elementwise kernel, so losses, norms, verdicts (the fp16 overflow skip
// included) and final weights equal the stage-0 Engine's BIT FOR BIT. Checkpoints resume
// bit-exactly and, at one rank, read as stage-0 checkpoints.
#include <gtest/gtest.h>
#include <omp.h>

#include <filesystem>
#include <fstream>

#include "tests/zero/zero_test_util.h"
#include "trainer/inference.h"

namespace dsactor::trainer {
namespace {

using namespace dsactor::trainer::test;
namespace fs = std::filesystem;

const GptConfig kTiny{2, 2, 32, 64, 16};
constexpr int kSteps = 30;

class ZeroLocal : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { omp_set_num_threads(1); }
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dsactor_zero_local_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void check_mode(const std::string& mode) {
    const auto tokens = corpus(6000, 1);
    const Trace want = run_stage0(kTiny, local_config(mode, 0), tokens, kSteps);
    if (mode == "fp16") {
      int skipped = 0;
      for (const auto& s : want.steps) skipped += s.skipped;
      ASSERT_GE(skipped, 1) << "the fp16 reference must skip at least one step";
    }
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE(mode + " stage " + std::to_string(stage));
      ZeroStats st;
      expect_equal_runs(want, run_local(kTiny, local_config(mode, stage), tokens, kSteps, &st));
      EXPECT_EQ(st.bytes_pushed, 0u) << "no service: nothing travels";
      EXPECT_EQ(st.bytes_fetched, 0u);
      EXPECT_EQ(st.optimizer_state_bytes, 3 * st.total_param_bytes) << "one rank holds it all";
    }
  }
  fs::path dir_;
};

TEST_F(ZeroLocal, Fp32StagesOneTwoThreeEqualStageZeroBitForBit) {
  check_mode("fp32");
}
TEST_F(ZeroLocal, Bf16StagesOneTwoThreeEqualStageZeroBitForBit) {
  check_mode("bf16");
}
TEST_F(ZeroLocal, Fp16WithSkippedStepsEqualsStageZeroBitForBit) {
  check_mode("fp16");
}

// One micro-step per step (no accumulation: a block's gradient lives from its backward to
// its reduction), stage 3 fetching every block before use from the rank's own partitions.
TEST_F(ZeroLocal, Stage3WithOneMicroStepEqualsStageZeroAndKeepsTheResidentSetBounded) {
  const GptConfig model{4, 2, 32, 64, 16};
  const auto layouts = gpt_block_layouts(model);
  const auto extra = nlohmann::json{{"gradient_accumulation_steps", 1},
                                    {"zero_optimization",
                                     {{"stage3_prefetch_bucket_size", layouts[1].numel},
                                      {"stage3_max_reuse_distance", 0},
                                      {"stage3_param_persistence_threshold", 100}}}};
  const auto tokens = corpus(6000, 4);
  const Trace want = run_stage0(model, local_config("bf16", 0, 4, 1, extra), tokens, 8);
  ZeroStats st;
  expect_equal_runs(want, run_local(model, local_config("bf16", 3, 4, 1, extra), tokens, 8, &st));
  EXPECT_LT(st.peak_resident_param_bytes, st.total_param_bytes);
  EXPECT_GT(st.scheduler.prefetch_hits, 0u) << "prefetch along the recorded order";
  EXPECT_GT(st.peak_resident_grad_bytes, 0u);
}

// Save at step 4, go on to 8; a fresh engine loads the checkpoint and trains the same 4
// steps: the same losses and weights, bit for bit (master, m, v, Adam's step count, the
// loss scaler's state and the counters all come back). fp16: the scaler's state matters.
TEST_F(ZeroLocal, CheckpointResumesBitForBitAndReadsAsAStageZeroCheckpoint) {
  const auto tokens = corpus(6000, 3);
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const DsConfig c = local_config("fp16", stage);
    const fs::path ck = dir_ / ("ck" + std::to_string(stage));
    Trace straight, resumed;
    nlohmann::json cursor;
    {
      ZeroEngine e(kTiny, c, 5, ZeroOptions{});
      BatchLoader loader(&tokens, 4, 16, true, 9);
      continue_run(e, loader, 4, straight);
      e.save_checkpoint(ck, {{"train_cursor", loader.cursor()}});
      // What a stage-0 reader (export, generate, eval) sees: the fp32 master of this step,
      // which rounded through fp16 is what the forward reads.
      BlockSet master = load_checkpoint_weights(ck).params;
      for (auto& b : master.blocks)
        kernels::cpu::round_through_half(b.data(), b.size(), kernels::cpu::HalfKind::kFP16);
      expect_same_params(e.gather_params(), master);
      continue_run(e, loader, 4, straight);
      straight.params = e.gather_params();
    }
    ZeroEngine e(kTiny, c, 77, ZeroOptions{});  // another seed: everything must come back
    BatchLoader loader(&tokens, 4, 16, true, 9);
    loader.restore(e.load_checkpoint(ck).at("train_cursor"));
    EXPECT_EQ(e.global_step(), 4);
    continue_run(e, loader, 4, resumed);
    resumed.params = e.gather_params();
    straight.steps.erase(straight.steps.begin(), straight.steps.begin() + 4);
    expect_equal_runs(straight, resumed);
  }
}

TEST_F(ZeroLocal, DamagedOrMismatchedCheckpointIsRefusedAndNothingChanges) {
  const auto tokens = corpus(6000, 6);
  const DsConfig c = local_config("fp32", 2);
  ZeroEngine e(kTiny, c, 5, ZeroOptions{});
  BatchLoader loader(&tokens, 4, 16, true, 9);
  e.train_step(loader);
  e.save_checkpoint(dir_ / "ck", {});
  e.train_step(loader);
  const BlockSet before = e.gather_params();

  // Another precision: refused by the manifest check.
  ZeroEngine bf16(kTiny, local_config("bf16", 2), 5, ZeroOptions{});
  EXPECT_THROW(bf16.load_checkpoint(dir_ / "ck"), std::runtime_error);
  // A flipped byte in the tensors: refused by its crc32c, the engine keeps its state.
  {
    std::fstream f(dir_ / "ck" / "tensors.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  EXPECT_THROW(e.load_checkpoint(dir_ / "ck"), std::exception);
  EXPECT_EQ(e.global_step(), 2);
  expect_same_params(before, e.gather_params());
  e.train_step(loader);  // and still trains
}

TEST(ZeroLocalConfig, RefusesWhatItCannotRunNamingIt) {
  auto refused = [](nlohmann::json zero, ZeroOptions o, const std::string& want) {
    const nlohmann::json j = {{"train_micro_batch_size_per_gpu", 4}, {"zero_optimization", zero}};
    try {
      ZeroEngine e(kTiny, parse_ds_config(j, "t.json"), 5, std::move(o));
      ADD_FAILURE() << "accepted " << zero.dump();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused({{"stage", 3}, {"offload_param", {{"device", "cpu"}}}}, ZeroOptions{},
          "offload_param needs offload_optimizer too");
  ZeroOptions with_service;
  with_service.services = {"tcp://127.0.0.1:9"};
  refused({{"stage", 2}}, with_service, "offload_optimizer is off");
  refused({{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}, ZeroOptions{},
          "needs at least one offload service");
}

}  // namespace
}  // namespace dsactor::trainer
