// `dsactor start --role trainer` against a same-host offload service: payloads go through the
// shared-memory arena by default and as frames with --no-shared-memory; the summary line says
// which, and both end with the same weights bit for bit.
#include <gtest/gtest.h>

#include "deploy/service_process.h"
#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"
#include "tests/zero/weights_test_util.h"

namespace dsactor {
namespace {

using dsactor::testing::run_dsactor;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;

TEST(StartTrainerPayloads, ArenaAndFramesTrainTheSameWeights) {
  TempDir dir;
  std::string corpus;
  for (int i = 0; i < 200; ++i)
    corpus += "five boxing wizards jump quickly " + std::to_string(i % 7) + "\n";
  write_file(dir.path() / "corpus.txt", corpus);
  write_file(dir.path() / "z3.json", R"({"train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                          "offload_param": {"device": "cpu"}}})");
  deploy::ServiceProcess service(DSACTOR_BINARY, {"--no-mlock"}, dir.path() / "service.log");
  std::string common =
      "start --role trainer --config z3.json --model tiny --data corpus.txt "
      "--steps 4 --offload " +
      service.endpoint();
  for (const auto& flag : service.trainer_flags()) common += " " + flag;
  const auto arena = run_dsactor(common + " --job arena --out arena", dir.path());
  ASSERT_EQ(arena.exit_code, 0) << arena.err;
  EXPECT_NE(arena.err.find("shared-memory arena"), std::string::npos) << arena.err;
  const auto frames =
      run_dsactor(common + " --job frames --out frames --no-shared-memory", dir.path());
  ASSERT_EQ(frames.exit_code, 0) << frames.err;
  EXPECT_NE(frames.err.find("payloads as frames"), std::string::npos) << frames.err;
  EXPECT_EQ(dsactor::testing::max_weight_difference(dir.path() / "arena/model.safetensors",
                                                    dir.path() / "frames/model.safetensors"),
            0.0f);
}

}  // namespace
}  // namespace dsactor
