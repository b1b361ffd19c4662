// `dsactor bench checkpoint --json` through the binary on the tiny model, on both paths
// (stage 0, and ZeRO-3 on an offload service that writes in the background): the run with
// checkpoints and the run without are measured in the same process, the saves land where
// `--dir` says (the newest `--keep-last` tags and `latest`), and the fractions are the
// quotients of the figures printed beside them. No timing is asserted.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/bench_report.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor {
namespace {

using dsactor::testing::number_at;

class BenchCheckpoint : public ::testing::TestWithParam<const char*> {};

TEST_P(BenchCheckpoint, ReportsTheOverheadAgainstTheSameRunWithoutCheckpoints) {
  const std::string path = GetParam();
  dsactor::testing::TempDir dir;
  const auto j = dsactor::testing::bench_report(
      "bench checkpoint --json --path " + path +
          " --model tiny --micro-batch 2 --seq 16 --every 2 --steps 6 --keep-last 2 --dir ckpt",
      dir.path());
  EXPECT_EQ(j.at("path"), path);
  EXPECT_EQ(j.at("saves"), 3);
  EXPECT_EQ(j.at("steps_per_phase"), 6);
  // The tiny model's master, m and v (3 x 4 bytes per parameter) are in the newest save:
  // the trainer's own on stage 0, the service's part on the offload path.
  EXPECT_GT(number_at(j, "checkpoint_bytes"), 12 * number_at(j, "parameters"));
  EXPECT_GT(number_at(j, "save_ms"), 0);
  const double without = number_at(j, "ms_per_step_without"),
               with = number_at(j, "ms_per_step_with");
  EXPECT_NEAR(number_at(j, "overhead_fraction"), (with - without) / without, 1e-9);
  EXPECT_NEAR(number_at(j, "save_overhead_fraction"), number_at(j, "save_ms") / (2 * without),
              1e-9);
  // Warmup 1 + 6 plain steps, then saves at 8, 10, 12 (on the offload path published at
  // the next step boundary, the last at the end); the two newest stay.
  const auto ckpt = dir.path() / "ckpt";
  EXPECT_EQ(dsactor::testing::read_file(ckpt / "latest"), "global_step12");
  EXPECT_TRUE(std::filesystem::exists(ckpt / "global_step10"));
  EXPECT_FALSE(std::filesystem::exists(ckpt / "global_step8"));
  if (path == "stage0") {
    EXPECT_TRUE(std::filesystem::exists(ckpt / "global_step10" / "manifest.json"));
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, BenchCheckpoint, ::testing::Values("stage0", "offload"));

}  // namespace
}  // namespace dsactor
