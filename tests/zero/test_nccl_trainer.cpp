// The data-parallel equivalence with NCCL carrying the gradients (`--collectives nccl`), for
// the GPU machines: 1 rank on device 0 must train exactly like `dsactor train` (an
// allreduce over one rank is a copy through the device: bit-identical weights), and with 2
// devices, 2 ranks x micro-batch 2 like 1 rank x 4 within the data-parallel tolerance
// (NCCL chooses the summation order; the halves differ from the one-rank sum by a few
// ulps, as in tests/zero/test_data_parallel.cpp). Without NCCL in the build the option is
// refused with a message saying so; without a CUDA device the GPU cases are skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#ifdef DSACTOR_HAVE_NCCL
#include <cuda_runtime.h>
#endif

#include "storage/safetensors.h"
#include "tests/cli/child_process.h"
#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"
#include "tests/zero/weights_test_util.h"

namespace dsactor {
namespace {

using dsactor::testing::Child;
using dsactor::testing::free_port;
using dsactor::testing::max_weight_difference;
using dsactor::testing::run_dsactor;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;

int cuda_devices() {
#ifdef DSACTOR_HAVE_NCCL
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
#else
  return 0;
#endif
}

void write_inputs(const std::filesystem::path& dir) {
  std::string corpus;
  for (int i = 0; i < 200; ++i)
    corpus += "jackdaws love my big sphinx of quartz " + std::to_string(i % 9) + "\n";
  write_file(dir / "corpus.txt", corpus);
  const char* opt =
      R"("gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 0.002}})";
  write_file(dir / "b4.json", std::string(R"({"train_micro_batch_size_per_gpu": 4, )") + opt + "}");
  write_file(dir / "b2.json", std::string(R"({"train_micro_batch_size_per_gpu": 2, )") + opt + "}");
}

TEST(NcclTrainer, RefusedWithAMessageWhenNotBuiltOrNoDevice) {
  if (cuda_devices() > 0) GTEST_SKIP() << "a CUDA device is present: the refusal cannot happen";
  TempDir dir;
  write_inputs(dir.path());
  const auto r = run_dsactor(
      "start --role trainer --config b4.json --model tiny --data corpus.txt --steps 2 "
      "--collectives nccl",
      dir.path());
  EXPECT_NE(r.exit_code, 0);
#ifdef DSACTOR_HAVE_NCCL
  EXPECT_NE(r.err.find("CUDA device 0 is not available"), std::string::npos) << r.err;
#else
  EXPECT_NE(r.err.find("not built with NCCL"), std::string::npos) << r.err;
#endif
}

// The reference: `dsactor train` on micro-batch 4 for 10 steps, exported to
// plain.safetensors.
void train_plain_reference(const std::filesystem::path& dir) {
  ASSERT_EQ(
      run_dsactor(
          "train --config b4.json --model tiny --data corpus.txt --steps 10 --out plain --sample 0",
          dir)
          .exit_code,
      0);
  ASSERT_EQ(run_dsactor("export --checkpoint plain --to plain.safetensors", dir).exit_code, 0);
}

TEST(NcclTrainer, OneRankOnTheDeviceTrainsExactlyLikeThePlainRun) {
  if (cuda_devices() < 1)
    GTEST_SKIP() << "no CUDA device: the NCCL equivalence runs on GPU machines";
  TempDir dir;
  write_inputs(dir.path());
  ASSERT_NO_FATAL_FAILURE(train_plain_reference(dir.path()));
  const auto r = run_dsactor(
      "start --role trainer --config b4.json --model tiny --data corpus.txt --steps 10 "
      "--collectives nccl --device 0 --out nccl",
      dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("on NCCL, CUDA device 0"), std::string::npos) << r.err;
  EXPECT_EQ(max_weight_difference(dir.path() / "nccl/model.safetensors",
                                  dir.path() / "plain.safetensors"),
            0.0f);
}

TEST(NcclTrainer, TwoRanksOnTwoDevicesTrainLikeOneRankWithTwiceTheBatch) {
  if (cuda_devices() < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << cuda_devices();
  TempDir dir;
  write_inputs(dir.path());
  ASSERT_NO_FATAL_FAILURE(train_plain_reference(dir.path()));
  const std::string coordinator = "tcp://127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = {"start",        "--role",  "trainer",
                                     "--config",     "b2.json", "--model",
                                     "tiny",         "--data",  "corpus.txt",
                                     "--steps",      "10",      "--collectives",
                                     "nccl",         "--rank",  std::to_string(r),
                                     "--world-size", "2",       "--coordinator",
                                     coordinator,    "--out",   "dp"};
    if (r == 0) args.push_back("--serve-coordinator");
    for (const auto& k : dsactor::testing::shared_trainer_keys(dir.path())) args.push_back(k);
    ranks.push_back(std::make_unique<Child>(dir.path(), args,
                                            dir.path() / ("rank" + std::to_string(r) + ".log")));
  }
  for (auto& c : ranks) ASSERT_EQ(c->wait(std::chrono::seconds(300)), 0) << c->log();
  EXPECT_LE(
      max_weight_difference(dir.path() / "dp/model.safetensors", dir.path() / "plain.safetensors"),
      1e-4f);
}

}  // namespace
}  // namespace dsactor
