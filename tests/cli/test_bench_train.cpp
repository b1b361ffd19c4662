// `dsactor bench train --json` through the binary on the tiny model: every figure is
// measured in this run, and the ratios are the quotients of the figures printed beside them
// (the step's achieved rate over the sgemm rate measured on the same machine just after it).
// No reference measured elsewhere is printed; no timing is asserted.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor {
namespace {

double at(const nlohmann::json& j, const char* k) {
  return j.at(k).get<double>();
}

TEST(BenchTrain, ReportsTheStepBesideTheSgemmRateOfTheSameRun) {
  dsactor::testing::TempDir dir;
  const auto r = dsactor::testing::run_dsactor(
      "bench train --json --model tiny --micro-batch 2 --seq 16 --steps 2 --warmup 1", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
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
  EXPECT_GT(at(j, "ms_per_step"), 0);
  EXPECT_GT(at(j, "sgemm_gflops"), 0);
  const double step_s = at(j, "ms_per_step") / 1e3;
  EXPECT_NEAR(at(j, "achieved_gflops"), at(j, "gflop_per_step") / step_s,
              1e-9 * at(j, "achieved_gflops"));
  EXPECT_DOUBLE_EQ(at(j, "fraction_of_sgemm"), at(j, "achieved_gflops") / at(j, "sgemm_gflops"));
  EXPECT_NEAR(at(j, "tokens_per_second"), 2 * 16 / step_s, 1e-9 * at(j, "tokens_per_second"));
}

}  // namespace
}  // namespace dsactor
