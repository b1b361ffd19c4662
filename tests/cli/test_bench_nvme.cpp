// `dsactor bench nvme --json` through the binary: both block sizes issue 16 names are
// measured by default, each in the asked number of pairs of ours and fio (order swapped
// every pair); our reads return the bytes written; every ratio is the quotient of the
// rates printed beside it and the median lies inside the range. No timing is asserted.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "tests/cli/bench_report.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor {
namespace {

TEST(BenchNvme, MeasuresBothBlockSizesInPairsAgainstFio) {
  dsactor::testing::TempDir dir;
  // 3 MiB + 4 KiB: the last block of each size is a partial one.
  const auto j = dsactor::testing::bench_report(
      "bench nvme --json --pairs 2 --bytes 3149824 --dir " + dir.path().string(), dir.path());
  const bool have_fio = j.at("fio").at("available").get<bool>();
  ASSERT_EQ(j.at("block_sizes").size(), 2u);
  std::vector<uint64_t> sizes;
  for (const auto& b : j.at("block_sizes")) {
    const uint64_t block = b.at("block_size").get<uint64_t>();
    sizes.push_back(block);
    SCOPED_TRACE("block size " + std::to_string(block));
    ASSERT_EQ(b.at("pairs").size(), 2u);
    for (size_t i = 0; i < b.at("pairs").size(); ++i) {
      const auto& p = b.at("pairs").at(i);
      // The order swaps every pair, so a drifting box favours neither side.
      EXPECT_EQ(p.at("fio_first").get<bool>(), have_fio && i % 2 == 1);
      const auto& own = p.at("dsactor");
      EXPECT_TRUE(own.at("verified").get<bool>());
      // Queue-depth (8) buffers of one block each: fio's memory for its requests.
      EXPECT_EQ(own.at("buffer_bytes").get<uint64_t>(), 8 * block);
      // Write, read and the window read, each split into whole and partial blocks.
      const uint64_t blocks = (3149824 + block - 1) / block;
      EXPECT_GE(own.at("requests").get<uint64_t>(), 2 * blocks);
      // fio may be missing, or refuse O_DIRECT where our file fell back to buffered I/O.
      if (!p.contains("ratio_to_fio")) {
        EXPECT_TRUE(!have_fio || p.at("fio").at("read").contains("error")) << p.dump();
        continue;
      }
      for (const char* rw : {"read", "write"}) {
        const double fio = p.at("fio").at(rw).at("GBps").get<double>();
        EXPECT_DOUBLE_EQ(p.at("ratio_to_fio").at(rw).get<double>(),
                         own.at(std::string(rw) + "_GBps").get<double>() / fio);
      }
    }
    if (!b.contains("ratio_to_fio_median")) continue;
    for (const char* rw : {"read", "write"}) {
      const double median = b.at("ratio_to_fio_median").at(rw).get<double>();
      const auto& range = b.at("ratio_to_fio_range").at(rw);
      EXPECT_LE(range.at(0).get<double>(), median);
      EXPECT_GE(range.at(1).get<double>(), median);
      EXPECT_DOUBLE_EQ(j.at("ratio_to_fio_median").at(std::to_string(block)).at(rw).get<double>(),
                       median);
    }
  }
  EXPECT_EQ(sizes, (std::vector<uint64_t>{131072, 1048576}));
  // The bench files are gone.
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().rfind("dsactor_nvme_bench_", 0), std::string::npos)
        << e.path();
}

TEST(BenchNvme, RefusesABlockSizeThatIsNotAMultipleOf4096) {
  dsactor::testing::TempDir dir;
  const auto r = dsactor::testing::run_dsactor(
      "bench nvme --json --pairs 1 --bytes 65536 --block-size 5000 --dir " + dir.path().string(),
      dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("block_size must be a positive multiple of 4096"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace dsactor
