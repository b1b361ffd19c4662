// wall_clock_breakdown and flops_profiler: the lines and tables DeepSpeed prints, from the
// formulas (the profile's MACs, FLOPs and params counted by hand for the tiny model) and
// through `dsactor train` as a user runs it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/cli/cli_test_util.h"
#include "trainer/model/param_blocks.h"
#include "trainer/monitor/flops_profiler.h"
#include "trainer/monitor/wall_clock.h"

namespace dsactor::trainer {
namespace {

namespace fs = std::filesystem;
using dsactor::testing::run_dsactor;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

size_t count_matches(const std::string& text, const std::regex& re) {
  return static_cast<size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

TEST(WallClockBreakdown, MeanPerStepInDeepSpeedsWords) {
  WallClockBreakdown w;
  StepResult a, b;
  a.forward_seconds = 0.010;
  a.backward_seconds = 0.020;
  a.optimizer_seconds = 0.003;
  b = a;
  b.forward_seconds = 0.030;
  w.add(a);
  w.add(b);
  EXPECT_EQ(*w.take_line(), "[Rank 0] time (ms) | fwd: 20.00 | bwd: 20.00 | step: 3.00");
  EXPECT_FALSE(w.take_line().has_value());  // nothing since
  a.fetch_seconds = 0.001;
  a.push_seconds = 0.0025;
  a.commit_seconds = 0.0005;
  w.add(a);
  EXPECT_EQ(*w.take_line(),
            "[Rank 0] time (ms) | fwd: 10.00 | bwd: 20.00 | step: 3.00 | fetch: 1.00 | push: "
            "2.50 | commit: 0.50");
}

const GptConfig kModel{2, 2, 32, 64, 16};  // L, NH, C, V, maxT

ForwardProfile timed(int B, int T) {
  ForwardProfile f;
  f.B = B;
  f.T = T;
  f.recorded = true;
  f.embedding = 0.001;
  f.layers = {{0.001, 0.004, 0.001, 0.003}, {0.001, 0.004, 0.001, 0.003}};
  f.ln_f = 0.001;
  f.lm_head = 0.002;
  f.total = 0.025;
  return f;
}

TEST(FlopsProfiler, CountsFollowDeepSpeedsRules) {
  const ModuleProfile m = gpt_module_profile(kModel, timed(4, 16));
  const double BT = 64, C = 32, T = 16, V = 64;
  EXPECT_EQ(m.params, static_cast<int64_t>(parameter_count(kModel)));
  ASSERT_EQ(m.children.size(), 4u);
  const ModuleProfile& block = m.children[1].children[0];
  ASSERT_EQ(block.children.size(), 4u);
  const ModuleProfile& attn = block.children[1];
  const ModuleProfile& mlp = block.children[3];
  // c_attn, Q K^T, att V, c_proj.
  EXPECT_DOUBLE_EQ(attn.macs, BT * C * 3 * C + 2 * 4 * T * T * C + BT * C * C);
  EXPECT_DOUBLE_EQ(attn.flops, 2 * attn.macs + 2 * 4 * 2 * T * T);  // + softmax and scaling
  EXPECT_DOUBLE_EQ(mlp.macs, 8 * BT * C * C);
  EXPECT_DOUBLE_EQ(mlp.flops, 16 * BT * C * C + 4 * BT * C);  // + GELU
  EXPECT_EQ(block.children[0].flops, 5 * BT * C);             // LayerNorm
  EXPECT_EQ(attn.params, 4 * 32 * 32 + 4 * 32);
  EXPECT_EQ(mlp.params, 8 * 32 * 32 + 5 * 32);
  EXPECT_DOUBLE_EQ(block.flops, 2 * 5 * BT * C + attn.flops + mlp.flops + 2 * BT * C);
  EXPECT_DOUBLE_EQ(m.children[3].macs, BT * C * V);  // the LM head
  EXPECT_DOUBLE_EQ(m.macs, 2 * block.macs + BT * C * V);
  EXPECT_DOUBLE_EQ(block.seconds, 0.009);
  EXPECT_DOUBLE_EQ(m.children[1].seconds, 0.018);  // a ModuleList: its blocks' sum
  EXPECT_DOUBLE_EQ(m.seconds, 0.025);
}

TEST(FlopsProfiler, TextHasDeepSpeedsSections) {
  const ModuleProfile m = gpt_module_profile(kModel, timed(4, 16));
  FlopsProfilerConfig o;
  o.module_depth = -1;
  o.top_modules = 1;
  o.detailed = true;
  const std::string t = flops_profile_text(m,
                                           {.profile_step = 3,
                                            .world_size = 1,
                                            .micro_batch = 4,
                                            .bwd_seconds = 0.05,
                                            .step_seconds = 0.01},
                                           o, 0.0);
  EXPECT_THAT(t, AllOf(HasSubstr("-------------------------- DeepSpeed Flops Profiler"),
                       HasSubstr("Profile Summary at step 3:"), HasSubstr("batch size per GPU:"),
                       HasSubstr("fwd latency:"), HasSubstr("25 ms"),
                       HasSubstr("bwd FLOPS per GPU = 2 * fwd flops per GPU / bwd latency:"),
                       HasSubstr("Aggregated Profile per GPU"), HasSubstr("depth 0:"),
                       HasSubstr("params      - {'GPT': "), HasSubstr("depth 2:"),
                       Not(HasSubstr("depth 3:")),  // like DeepSpeed: -1 stops one short
                       HasSubstr("Detailed Profile per GPU"), HasSubstr("GPT(\n"),
                       HasSubstr("  (h): ModuleList(\n"), HasSubstr("    (0): Block(\n"),
                       HasSubstr("      (attn): Attention("), HasSubstr("  (lm_head): Linear(")));
  // One line per module: the model, embedding, h, 2 blocks x (1 + 4), ln_f, lm_head.
  EXPECT_EQ(count_matches(t, std::regex("% Params, ")), 15u);
  o.detailed = false;
  o.module_depth = 1;
  o.top_modules = 3;
  const std::string s = flops_profile_text(m, {}, o, 1.0);
  EXPECT_THAT(s, AllOf(Not(HasSubstr("Detailed Profile")), HasSubstr("depth 0:"),
                       Not(HasSubstr("depth 1:")), HasSubstr("Top 3 modules"),
                       HasSubstr("bwd FLOPS per GPU = 3 * fwd flops per GPU")));
}

class ProfilingCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dsactor_profiling_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream text(dir_ / "corpus.txt");
    for (int i = 0; i < 200; ++i) text << "the quick brown fox " << i % 7 << "\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(ProfilingCli, TrainPrintsTheBreakdownEveryPrintIntervalAndTheProfileOnce) {
  std::ofstream(dir_ / "ds.json") << R"({"train_micro_batch_size_per_gpu": 2,
    "steps_per_print": 2, "wall_clock_breakdown": true,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "flops_profiler": {"enabled": true, "profile_step": 1, "output_file": "prof/flops.txt"}})";
  const auto r = run_dsactor(
      "train --config ds.json --model tiny --data corpus.txt --seq 16 --steps 4 --out run "
      "--sample 0",
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::regex line(
      R"(\[Rank 0\] time \(ms\) \| fwd: [0-9]+\.[0-9]{2} \| bwd: [0-9]+\.[0-9]{2} \| step: )"
      R"([0-9]+\.[0-9]{2}\n)");
  EXPECT_EQ(count_matches(r.err, line), 2u) << r.err;  // steps 2 and 4
  std::ifstream in(dir_ / "prof" / "flops.txt");
  ASSERT_TRUE(in) << r.err;
  std::stringstream profile;
  profile << in.rdbuf();
  EXPECT_THAT(profile.str(),
              AllOf(HasSubstr("Profile Summary at step 1:"), HasSubstr("batch size per GPU:"),
                    HasSubstr("(embedding): Embedding("), HasSubstr("(1): Block("),
                    HasSubstr("(mlp): MLP(")));
  EXPECT_THAT(r.err, HasSubstr("the profile of step 1 is in prof/flops.txt"));
}

}  // namespace
}  // namespace dsactor::trainer
