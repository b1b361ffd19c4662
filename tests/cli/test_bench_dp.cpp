// `dsactor bench dp --json` through the binary: the report's figures must be consistent with
// each other (ratios are the quotients of the times printed beside them, every collective
// is measured for both implementations, both world sizes of the step-time phase ran). No
// timing is asserted.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor {
namespace {

TEST(BenchDp, ReportsCollectivesBesideGlooAndTheStepTimeFromOneToTwoRanks) {
  dsactor::testing::TempDir dir;
  const auto r = dsactor::testing::run_dsactor(
      "bench dp --json --bytes 65536 --iters 1 --model tiny --micro-batch 2 --seq 16 --steps 2",
      dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
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
}

}  // namespace
}  // namespace dsactor
