// `dsactor bench train --json` through the binary on the tiny model: every figure is
// measured in this run, and the ratios are the quotients of the figures printed beside them
// (the step's achieved rate over the sgemm rate measured on the same machine just after it).
// No reference measured elsewhere is printed; no timing is asserted.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/bench_report.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor {
namespace {

using dsactor::testing::number_at;

TEST(BenchTrain, ReportsTheStepBesideTheSgemmRateOfTheSameRun) {
  dsactor::testing::TempDir dir;
  const auto j = dsactor::testing::bench_report(
      "bench train --json --model tiny --micro-batch 2 --seq 16 --steps 2 --warmup 1", dir.path());
  const std::set<std::string> expected = {
      "model",          "parameters",        "micro_batch",    "seq",
      "steps_measured", "ms_per_step",       "forward_ms",     "backward_ms",
      "optimizer_ms",   "tokens_per_second", "gflop_per_step", "achieved_gflops",
      "sgemm_gflops",   "fraction_of_sgemm"};
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(j.at("model"), "tiny");
  EXPECT_EQ(j.at("steps_measured"), 2);
  EXPECT_GT(number_at(j, "ms_per_step"), 0);
  EXPECT_GT(number_at(j, "sgemm_gflops"), 0);
  const double step_s = number_at(j, "ms_per_step") / 1e3;
  EXPECT_NEAR(number_at(j, "achieved_gflops"), number_at(j, "gflop_per_step") / step_s,
              1e-9 * number_at(j, "achieved_gflops"));
  EXPECT_DOUBLE_EQ(number_at(j, "fraction_of_sgemm"),
                   number_at(j, "achieved_gflops") / number_at(j, "sgemm_gflops"));
  EXPECT_NEAR(number_at(j, "tokens_per_second"), 2 * 16 / step_s,
              1e-9 * number_at(j, "tokens_per_second"));
}

}  // namespace
}  // namespace dsactor
