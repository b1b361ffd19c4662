// `dsactor bench transport --json` through the binary on a small partition: every path
// (raw ZeroMQ, the service through frames and through the arena, each plain and with
// CurveZMQ) moved its bytes both ways, the arena also in place (the trainer's one-micro-step
// fp32 push, each push micro-step 0 of its own step), the service's paths also as the
// trainer pushes (micro-step 0 of a step; the service refuses a micro-step 0 twice in one
// step; through frames in ranges of --push-range-bytes, which raw ZeroMQ also sends), and
// fetched as the trainer fetches (over frames in ranges of --fetch-part-bytes, which raw ZeroMQ
// also asks for, each range copied out as it arrives), and every ratio is the quotient of the
// rates printed beside it. No rate is asserted.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/bench_report.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor {
namespace {

using dsactor::testing::number_at;

TEST(BenchTransport, EveryPathMovesItsBytesAndEveryRatioIsAQuotient) {
  dsactor::testing::TempDir dir;
  // 1 MiB + 4 bytes: a payload that is not a whole number of pages or 96 KiB pieces.
  const auto j = dsactor::testing::bench_report(
      "bench transport --json --partition-bytes 1048580 --iters 2 --push-range-bytes 262144 "
      "--fetch-part-bytes 131072",
      dir.path());
  EXPECT_EQ(number_at(j, "partition_bytes"), 1048580);
  EXPECT_EQ(number_at(j, "push_range_bytes"), 262144);
  EXPECT_EQ(number_at(j, "fetch_part_bytes"), 131072);
  for (const char* path : {"raw_zmq", "service", "service_arena"})
    for (const char* mode : {"plain", "curve"}) {
      const auto& run = j.at(path).at(mode);
      EXPECT_GT(number_at(run, "push_gbps"), 0) << path << " " << mode;
      EXPECT_GT(number_at(run, "fetch_gbps"), 0) << path << " " << mode;
      EXPECT_GT(number_at(run, "fetch_ranges_gbps"), 0) << path << " " << mode;
      const auto& ratio = j.at("ratio_to_raw_plain").at(std::string(path) + "_" + mode);
      EXPECT_DOUBLE_EQ(
          number_at(ratio, "push"),
          number_at(run, "push_gbps") / number_at(j.at("raw_zmq").at("plain"), "push_gbps"));
      EXPECT_DOUBLE_EQ(
          number_at(ratio, "fetch"),
          number_at(run, "fetch_gbps") / number_at(j.at("raw_zmq").at("plain"), "fetch_gbps"));
      if (std::string(path) == "raw_zmq") {
        EXPECT_FALSE(run.contains("push_step_gbps")) << "raw ZeroMQ has no steps";
        EXPECT_GT(number_at(run, "push_ranges_gbps"), 0) << mode;
        EXPECT_GT(number_at(run, "fetch_parts_gbps"), 0) << mode;
        continue;
      }
      EXPECT_GT(number_at(run, "push_step_gbps"), 0) << path << " " << mode;
      EXPECT_DOUBLE_EQ(
          number_at(ratio, "push_step"),
          number_at(run, "push_step_gbps") / number_at(j.at("raw_zmq").at("plain"), "push_gbps"));
      EXPECT_DOUBLE_EQ(number_at(ratio, "fetch_over_raw_parts"),
                       number_at(run, "fetch_gbps") /
                           number_at(j.at("raw_zmq").at("plain"), "fetch_parts_gbps"));
      EXPECT_DOUBLE_EQ(number_at(ratio, "fetch_ranges_over_raw_ranges"),
                       number_at(run, "fetch_ranges_gbps") /
                           number_at(j.at("raw_zmq").at("plain"), "fetch_ranges_gbps"));
      EXPECT_DOUBLE_EQ(number_at(ratio, "push_step_over_raw_ranges"),
                       number_at(run, "push_step_gbps") /
                           number_at(j.at("raw_zmq").at("plain"), "push_ranges_gbps"));
    }
  const double memcpy_gbps = number_at(j, "memcpy_gbps");
  ASSERT_GT(memcpy_gbps, 0);
  const auto& arena = j.at("service_arena").at("plain");
  EXPECT_GT(number_at(arena, "push_in_place_gbps"), 0);
  EXPECT_GT(number_at(j.at("service_arena").at("curve"), "push_in_place_gbps"), 0);
  const auto& to_memcpy = j.at("ratio_to_memcpy");
  for (const char* path : {"raw_zmq", "service", "service_arena"}) {
    EXPECT_DOUBLE_EQ(number_at(to_memcpy.at(path), "push"),
                     number_at(j.at(path).at("plain"), "push_gbps") / memcpy_gbps);
    EXPECT_DOUBLE_EQ(number_at(to_memcpy.at(path), "fetch"),
                     number_at(j.at(path).at("plain"), "fetch_gbps") / memcpy_gbps);
  }
  for (const char* path : {"service", "service_arena"})
    EXPECT_DOUBLE_EQ(number_at(to_memcpy.at(path), "push_step"),
                     number_at(j.at(path).at("plain"), "push_step_gbps") / memcpy_gbps);
  EXPECT_DOUBLE_EQ(number_at(to_memcpy.at("service_arena"), "push_in_place"),
                   number_at(arena, "push_in_place_gbps") / memcpy_gbps);
  EXPECT_FALSE(j.at("service").at("plain").contains("push_in_place_gbps"))
      << "frames have no in-place push";
}

TEST(BenchTransport, AFetchPartTooSmallIsRefusedNamingTheFlag) {
  dsactor::testing::TempDir dir;
  const auto r =
      dsactor::testing::run_dsactor("bench transport --fetch-part-bytes 1000", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--fetch-part-bytes"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("4096"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dsactor
