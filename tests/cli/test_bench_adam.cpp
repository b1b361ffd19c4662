// `dsactor bench adam --json` through the binary on a small array: the Adam pass and its
// stream probe, and the gradient's sum of squares on the best and the scalar path, each with
// its rate, and the sum's time over Adam's the quotient of the rates printed beside it. No
// rate is asserted.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/cli/bench_report.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor {
namespace {

using dsactor::testing::number_at;

TEST(BenchAdam, TimesAdamAndTheSumOfSquaresOnTheSameParameters) {
  dsactor::testing::TempDir dir;
  const auto j =
      dsactor::testing::bench_report("bench adam --json --params 100003 --iters 2", dir.path());
  EXPECT_EQ(number_at(j, "n_params"), 100003);
  for (const char* kernel : {"adam", "stream_probe", "grad_stats", "grad_stats_scalar"})
    EXPECT_GT(number_at(j.at(kernel), "params_per_s"), 0) << kernel;
  EXPECT_EQ(number_at(j.at("grad_stats"), "bytes_per_param"), 4);
  EXPECT_EQ(number_at(j.at("adam"), "bytes_per_param"), 28);
  // Times over the same parameter count: the quotient of the rates, inverted.
  EXPECT_NEAR(
      number_at(j, "grad_stats_time_over_adam"),
      number_at(j.at("adam"), "params_per_s") / number_at(j.at("grad_stats"), "params_per_s"),
      1e-9 * number_at(j, "grad_stats_time_over_adam"));
}

}  // namespace
}  // namespace dsactor
