// The whole product path of issue 4 through the real binary: `dsactor up` starts an offload
// service and a ZeRO trainer; the trainer's final weights must equal, bit for bit, those of
// `dsactor train` (stage 0, one process) on the same config, seed and data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "storage/safetensors.h"
#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"
#include "tests/zero/weights_test_util.h"

namespace dsactor::actors {
namespace {

using dsactor::testing::free_port;
using dsactor::testing::run_dsactor;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;

const char* kOptimizer = R"("train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "weight_decay": 0.01}})";

void expect_same_weights(const std::filesystem::path& a, const std::filesystem::path& b) {
  const auto x = storage::read_safetensors(a), y = storage::read_safetensors(b);
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (const auto& [name, t] : x.tensors) {
    ASSERT_EQ(y.tensors.count(name), 1u) << name;
    EXPECT_TRUE(t.bytes == y.tensors.at(name).bytes) << name << " differs";
  }
}

class UpZero : public ::testing::TestWithParam<const char*> {};

TEST_P(UpZero, DeployedZeroTrainerEndsWithTheWeightsOfStageZero) {
  TempDir dir;
  std::string corpus;
  for (int i = 0; i < 200; ++i)
    corpus += "pack my box with five dozen liquor jugs " + std::to_string(i % 9) + "\n";
  write_file(dir.path() / "corpus.txt", corpus);
  write_file(dir.path() / "stage0.json", std::string("{") + kOptimizer + "}");
  write_file(dir.path() / "zero.json",
             std::string("{") + kOptimizer + ", \"zero_optimization\": " + GetParam() + "}");
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(free_port());
  write_file(dir.path() / "deploy.yaml",
             "job: e2e\nroles:\n"
             "  - {role: offload, name: off, listen: \"" +
                 endpoint +
                 "\"}\n"
                 "  - {role: trainer, config: zero.json, model: tiny, data: corpus.txt, steps: 6, "
                 "out: zero_out}\n");

  const auto up = run_dsactor("up deploy.yaml", dir.path());
  ASSERT_EQ(up.exit_code, 0) << up.out << up.err;
  EXPECT_NE(up.out.find("done at step 6"), std::string::npos) << up.out;

  const auto train = run_dsactor(
      "train --config stage0.json --model tiny --data corpus.txt --steps 6 --out s0 --sample 0",
      dir.path());
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const auto exp = run_dsactor("export --checkpoint s0 --to s0.safetensors", dir.path());
  ASSERT_EQ(exp.exit_code, 0) << exp.err;
  expect_same_weights(dir.path() / "zero_out" / "model.safetensors", dir.path() / "s0.safetensors");
}

INSTANTIATE_TEST_SUITE_P(
    Stages, UpZero,
    ::testing::Values(
        R"({"stage": 1, "offload_optimizer": {"device": "cpu"}})",
        R"({"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}, "stage3_prefetch_bucket_size": 15000})"));

}  // namespace
}  // namespace dsactor::actors

namespace dsactor::actors {
namespace {

// Issue 5 through `dsactor up`: two trainers (ranks from the file, rank 0 serving the
// rendezvous the deployment assigns), each with its own offload service, against `dsactor
// train` with twice the micro-batch. Tolerance as in tests/zero/test_data_parallel.cpp: only
// the summation order of the two halves of the batch differs.
// own_services: each trainer lists its own offload role; otherwise both trainers use both
// services (the deployment's default), each rank under its own job there.
class UpDataParallel : public ::testing::TestWithParam<bool> {};

TEST_P(UpDataParallel, TwoTrainersEndWithTheWeightsOfOneTrainerWithTwiceTheBatch) {
  const bool own_services = GetParam();
  TempDir dir;
  std::string corpus;
  for (int i = 0; i < 200; ++i)
    corpus += "how vexingly quick daft zebras jump " + std::to_string(i % 9) + "\n";
  write_file(dir.path() / "corpus.txt", corpus);
  const char* opt =
      R"("gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 0.002}})";
  write_file(dir.path() / "one.json",
             std::string(R"({"train_micro_batch_size_per_gpu": 4, )") + opt + "}");
  write_file(dir.path() / "dp.json",
             std::string(R"({"train_micro_batch_size_per_gpu": 2, )") + opt +
                 R"(, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})");
  std::string yaml = "job: dp\nroles:\n";
  for (int r = 0; r < 2; ++r)
    yaml += "  - {role: offload, name: off" + std::to_string(r) +
            ", listen: \"tcp://127.0.0.1:" + std::to_string(free_port()) + "\"}\n";
  for (int r = 0; r < 2; ++r)
    yaml += "  - {role: trainer, name: t" + std::to_string(r) + ", rank: " + std::to_string(r) +
            ", config: dp.json, model: tiny, data: corpus.txt, steps: 8, out: dp_out" +
            (own_services ? ", offload: [off" + std::to_string(r) + "]" : std::string()) + "}\n";
  yaml += "rendezvous: \"tcp://127.0.0.1:" + std::to_string(free_port()) + "\"\n";
  // Periodic saves with keep-last at two ranks: each rank retires its own services' parts
  // of a tag before either removes it (a shared checkpoint directory).
  yaml += "checkpoint: {every: 2, keep_last: 1}\n";
  write_file(dir.path() / "deploy.yaml", yaml);
  const auto up = run_dsactor("up deploy.yaml", dir.path());
  ASSERT_EQ(up.exit_code, 0) << up.out << up.err;
  EXPECT_NE((up.out + up.err).find("rank 1 of 2"), std::string::npos) << up.out << up.err;
  std::vector<std::string> tags;
  for (const auto& e : std::filesystem::directory_iterator(dir.path() / "dp_out/checkpoint"))
    if (e.is_directory()) tags.push_back(e.path().filename().string());
  EXPECT_EQ(tags, std::vector<std::string>{"global_step8"});
  for (const char* rank : {"rank-0", "rank-1"})
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "dp_out/checkpoint/global_step8" / rank /
                                        "trainer/manifest.json"))
        << rank;
  EXPECT_EQ((up.out + up.err).find("not deleted"), std::string::npos) << up.out << up.err;

  const auto train = run_dsactor(
      "train --config one.json --model tiny --data corpus.txt --steps 8 --out one --sample 0",
      dir.path());
  ASSERT_EQ(train.exit_code, 0) << train.err;
  ASSERT_EQ(run_dsactor("export --checkpoint one --to one.safetensors", dir.path()).exit_code, 0);
  EXPECT_LE(dsactor::testing::max_weight_difference(dir.path() / "dp_out" / "model.safetensors",
                                                    dir.path() / "one.safetensors"),
            1e-4f);
}

INSTANTIATE_TEST_SUITE_P(Placement, UpDataParallel, ::testing::Values(true, false),
                         [](const auto& info) {
                           return std::string(info.param ? "OwnServices" : "SharedServices");
                         });

}  // namespace
}  // namespace dsactor::actors
