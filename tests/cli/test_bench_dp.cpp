// `dsactor bench dp --json` through the binary: the report's figures must be consistent with
// each other (ratios are the quotients of the times printed beside them, every collective
// is measured for both implementations, both world sizes of the step-time phase ran), and
// ZeRO's per-rank state counters scale as 1/W. No timing is asserted.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/cli/bench_report.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor {
namespace {

TEST(BenchDp, ReportsCollectivesTheStepTimeAndZeroMemoryPerRank) {
  dsactor::testing::TempDir dir;
  const auto j = dsactor::testing::bench_report(
      "bench dp --json --bytes 65536 --iters 1 --model small --micro-batch 2 --seq 16 --steps 2",
      dir.path());
  ASSERT_EQ(j.at("results").size(), 6u);
  std::map<std::string, std::map<std::string, double>> t;
  for (const auto& x : j.at("results")) {
    EXPECT_GT(x.at("seconds_per_call").get<double>(), 0);
    t[x.at("op")][x.at("impl")] = x.at("seconds_per_call").get<double>();
  }
  for (const char* op : {"allreduce", "reduce_scatter", "allgather"}) {
    ASSERT_EQ(t[op].size(), 2u) << op;
    EXPECT_DOUBLE_EQ(j.at("dsactor_speed_vs_gloo").at(op).get<double>(),
                     t[op]["gloo"] / t[op]["dsactor"])
        << op;
  }
  const auto& s = j.at("step_time");
  const double s1 = s.at("ranks").at("1").at("seconds_per_step").get<double>();
  const double s2 = s.at("ranks").at("2").at("seconds_per_step").get<double>();
  EXPECT_GT(s1, 0);
  EXPECT_GT(s2, 0);
  EXPECT_DOUBLE_EQ(s.at("step_time_ratio_2_over_1").get<double>(), s2 / s1);
  // 2 ranks process twice the tokens of 1 rank per step.
  EXPECT_DOUBLE_EQ(s.at("ranks").at("2").at("tokens_per_second").get<double>() * s2,
                   2 * s.at("ranks").at("1").at("tokens_per_second").get<double>() * s1);

  // ZeRO without offload: the engines' counters per rank against stage 0's. The optimizer
  // state and the gradient partitions kept for it are 1/W (up to the 4 KiB alignment of the
  // partitions and the small blocks one rank owns whole); stage 3 never holds every block.
  const auto& m = j.at("zero_memory");
  const auto& stage0 = m.at("stage0");
  EXPECT_EQ(stage0.at("optimizer_state_bytes").get<double>(),
            3 * stage0.at("param_bytes").get<double>());
  for (const char* stage : {"1", "2", "3"})
    for (const char* w : {"1", "2", "4"}) {
      SCOPED_TRACE(std::string("stage ") + stage + " W " + w);
      const auto& p = m.at("stages").at(stage).at(w);
      const double goal = p.at("goal_ratio").get<double>();
      EXPECT_DOUBLE_EQ(goal, 1.0 / std::stoi(w));
      for (const char* c : {"optimizer_state_bytes", "param_bytes", "kept_grad_bytes"})
        EXPECT_DOUBLE_EQ(p.at(std::string(c) + "_ratio").get<double>(),
                         p.at(c).get<double>() / stage0.at(c).get<double>())
            << c;
      EXPECT_LE(p.at("optimizer_state_bytes_ratio").get<double>(), goal + 0.02);
      EXPECT_GE(p.at("optimizer_state_bytes_ratio").get<double>(), goal);
      EXPECT_LE(p.at("kept_grad_bytes_ratio").get<double>(), goal + 0.02);
      if (std::string(stage) == "3") {
        EXPECT_LT(p.at("param_bytes_ratio").get<double>(), 1.0);
      }
    }
}

}  // namespace
}  // namespace dsactor
