// ZeRO stages 1-3 without offload services at W > 1 ranks (threads of this process, Gloo on
// 127.0.0.1): each rank holds the master and Adam moments of its 1/W partition of every
// block, reduce-scatters the gradients and keeps its partition, and gathers the parameters
// (stages 1/2 after each step, stage 3 per block before use).
//
// 2 ranks of micro-batch 2 against 1 rank of micro-batch 4 (stage 0): the same rows and the
// same dloss, summed in another order (each rank sums its rows, the reduce-scatter adds the
// two halves), so losses agree within 1e-5 relative, weights within 1e-4 (see
// test_data_parallel.cpp). Checkpoints resume bit for bit; the per-rank state counters
// scale as 1/W.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>

#include "tests/zero/zero_test_util.h"

namespace dsactor::trainer {
namespace {

using namespace dsactor::trainer::test;
namespace fs = std::filesystem;

const GptConfig kTiny{2, 2, 32, 64, 16};

class ZeroLocalDp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { omp_set_num_threads(1); }
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dsactor_zero_local_dp_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(ZeroLocalDp, TwoRanksOfMicroBatchTwoLearnWhatOneRankOfFourLearns) {
  constexpr int kSteps = 20;
  const auto tokens = corpus(8000, 2);
  const Trace want = run_stage0(kTiny, local_config("fp32", 0, 4), tokens, kSteps);
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    // overlap_comm on in stage 2 (DeepSpeed's default is off there, on in stage 3).
    const auto extra = stage == 2 ? nlohmann::json{{"zero_optimization", {{"overlap_comm", true}}}}
                                  : nlohmann::json::object();
    const DsConfig c = local_config("fp32", stage, 2, 2, extra);
    Trace got[2];
    ZeroStats stats[2];
    run_ranks(2, [&](int r, const RankComms& comms) {
      ZeroEngine e(kTiny, c, 5, comms.options(r, 2));
      BatchLoader loader(&tokens, 2, 16, true, 9, r, 2);
      continue_run(e, loader, kSteps, got[r]);
      got[r].params = e.gather_params();
      stats[r] = e.stats();
    });
    double worst = 0;
    for (int i = 0; i < kSteps; ++i) {
      EXPECT_TRUE(same_bits(got[0].steps[i].loss, got[1].steps[i].loss)) << "step " << i + 1;
      const double rel = std::abs(got[0].steps[i].loss - want.steps[i].loss) / want.steps[i].loss;
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 1e-5) << "step " << i + 1;
    }
    EXPECT_LT(got[0].steps.back().loss, got[0].steps.front().loss - 0.5f) << "it learned";
    float worst_weight = 0;
    for (size_t b = 0; b < want.params.blocks.size(); ++b)
      for (size_t i = 0; i < want.params.blocks[b].size(); ++i) {
        EXPECT_EQ(got[0].params.blocks[b][i], got[1].params.blocks[b][i]);
        worst_weight =
            std::max(worst_weight, std::abs(got[0].params.blocks[b][i] - want.params.blocks[b][i]));
      }
    EXPECT_LE(worst_weight, 1e-4f);
    if (stage != 1) {
      EXPECT_GT(stats[0].overlapped_reductions, 0u) << "reduce-scatters behind the backward";
    }
    std::printf("stage %d: worst loss difference %.3g relative, worst weight difference %.3g\n",
                stage, worst, worst_weight);
  }
}

// Each step frees and allocates every layer's whole-block buffers (its gradient before the
// reduce-scatter, in stage 3 its gathered parameters): at W = 2 those hold 2 partitions of
// P floats, padding included, so that is the size whose freed mappings are kept for reuse
// (a layer's numel would match none of them, and every fetch would fault its pages in).
TEST_F(ZeroLocalDp, TheLayersWholeBlockBuffersAreTheMappingsKeptForReuse) {
  const GptConfig model{2, 2, 96, 64, 16};  // a layer's numel is no multiple of 2 * 1024
  const size_t layer = gpt_block_layouts(model)[1].numel;
  ASSERT_NE(layer % (2 * PartitionPlan::kPartitionAlign), 0u);
  const DsConfig one = local_config("fp32", 3, 4, 1);
  ZeroEngine single(model, one, 5, ZeroOptions{});
  EXPECT_EQ(single.reused_mapping_bytes(), layer * sizeof(float));
  const DsConfig c = local_config("fp32", 3, 2, 2);
  size_t reused[2] = {0, 0}, padded[2] = {0, 0};
  run_ranks(2, [&](int r, const RankComms& comms) {
    ZeroEngine e(model, c, 5, comms.options(r, 2));
    reused[r] = e.reused_mapping_bytes();
    padded[r] = 2 * e.plan().partition_numel(1) * sizeof(float);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(reused[r], padded[r]);
    EXPECT_GT(reused[r], layer * sizeof(float));
  }
}

// Both ranks save at step 3 (each its own rank-<r>/ directory with its partitions), train on
// to 6; two fresh ranks load and train the same 3 steps: bit for bit.
TEST_F(ZeroLocalDp, TwoRankCheckpointResumesBitForBit) {
  const auto tokens = corpus(8000, 5);
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const DsConfig c = local_config("bf16", stage, 2, 2);
    const fs::path ck = dir_ / ("ck" + std::to_string(stage));
    Trace straight[2], resumed[2];
    run_ranks(2, [&](int r, const RankComms& comms) {
      ZeroEngine e(kTiny, c, 5, comms.options(r, 2));
      BatchLoader loader(&tokens, 2, 16, true, 9, r, 2);
      continue_run(e, loader, 3, straight[r]);
      e.save_checkpoint(ck, {{"train_cursor", loader.cursor()}});
      continue_run(e, loader, 3, straight[r]);
      straight[r].params = e.gather_params();
    });
    EXPECT_TRUE(fs::exists(ck / "rank-0" / "manifest.json"));
    EXPECT_TRUE(fs::exists(ck / "rank-1" / "manifest.json"));
    run_ranks(2, [&](int r, const RankComms& comms) {
      ZeroEngine e(kTiny, c, 99, comms.options(r, 2));
      BatchLoader loader(&tokens, 2, 16, true, 9, r, 2);
      loader.restore(e.load_checkpoint(ck).at("train_cursor"));
      continue_run(e, loader, 3, resumed[r]);
      resumed[r].params = e.gather_params();
    });
    for (int r = 0; r < 2; ++r) {
      straight[r].steps.erase(straight[r].steps.begin(), straight[r].steps.begin() + 3);
      expect_equal_runs(straight[r], resumed[r]);
    }
  }
}

// The per-rank counters at W = 1, 2, 4: every element of the fp32 master, m and v is held by
// exactly one rank (the sum over ranks is stage 0's 12 bytes per parameter) and no rank
// holds more than its partitions (1/W of each block, rounded up to 4 KiB); the same for the
// gradient partitions kept for the optimizer; stage 3 never holds the whole model's
// parameters at once. Counters, not timings.
TEST_F(ZeroLocalDp, PerRankStateScalesAsOneOverW) {
  const GptConfig model{2, 2, 128, 256, 16};
  const auto tokens = corpus(8000, 7);
  const auto extra = nlohmann::json{{"gradient_accumulation_steps", 1}};
  for (int stage : {1, 2, 3})
    for (int world : {1, 2, 4}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " W " + std::to_string(world));
      const DsConfig c = local_config("fp32", stage, 1, world, extra);
      std::vector<ZeroStats> stats(world);
      std::vector<size_t> bound(world);  // this rank's partitions, padded: 4 bytes each
      run_ranks(world, [&](int r, const RankComms& comms) {
        ZeroEngine e(model, c, 5, comms.options(r, world));
        BatchLoader loader(&tokens, 1, 16, true, 9, r, world);
        e.train_step(loader);
        stats[r] = e.stats();
        for (size_t b = 0; b < e.plan().blocks(); ++b)
          bound[r] += e.plan().partition_numel(b) * sizeof(float);
      });
      const size_t total = stats[0].total_param_bytes;
      size_t optimizer = 0, kept = 0;
      for (int r = 0; r < world; ++r) {
        optimizer += stats[r].optimizer_state_bytes;
        kept += stats[r].kept_grad_bytes;
        EXPECT_LE(stats[r].optimizer_state_bytes, 3 * bound[r]) << "rank " << r;
        EXPECT_LE(stats[r].kept_grad_bytes, bound[r]) << "rank " << r;
        // Alignment and the small blocks that one rank owns whole cost little here.
        EXPECT_LE(stats[r].optimizer_state_bytes, 3 * total / world * 105 / 100) << "rank " << r;
        if (stage == 3 && world > 1) {
          EXPECT_LT(stats[r].peak_resident_param_bytes, total) << "rank " << r;
        }
      }
      EXPECT_EQ(optimizer, 3 * total) << "each element of master, m and v on exactly one rank";
      EXPECT_GE(kept, total) << "every gradient element kept by some rank";
      std::printf("stage %d W %d: optimizer state %zu of %zu B per rank, kept gradients %zu B\n",
                  stage, world, stats[0].optimizer_state_bytes, 3 * total,
                  stats[0].kept_grad_bytes);
    }
}

}  // namespace
}  // namespace dsactor::trainer
