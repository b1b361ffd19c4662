// `dsactor start --role trainer` against a same-host offload service: payloads go through the
// shared-memory arena by default and as frames with --no-shared-memory; the summary line says
// which, and both end with the same weights bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

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

// A trainer whose service shares its host restarts itself once with OMP_WAIT_POLICY=passive
// (libgomp reads it only at load), before anything else, unless the user set it; one
// whose services are elsewhere keeps OpenMP's default. Checked on runs that stop at the
// missing --config right after that point.
TEST(StartTrainerPayloads, BesideALocalServiceIdleOpenMpThreadsSleep) {
  TempDir dir;
  const char* before = std::getenv("OMP_WAIT_POLICY");
  const std::optional<std::string> saved =
      before ? std::optional<std::string>(before) : std::nullopt;
  auto restarts = [&](const std::string& endpoint) {
    const auto r =
        run_dsactor("start --role trainer --data corpus.txt --offload " + endpoint, dir.path());
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("needs --config"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("keep spinning"), std::string::npos) << "the restart ran: " << r.err;
    size_t count = 0;
    for (size_t at = r.err.find("restarting with OMP_WAIT_POLICY=passive"); at != std::string::npos;
         at = r.err.find("restarting with", at + 1))
      ++count;
    return count;
  };
  unsetenv("OMP_WAIT_POLICY");
  EXPECT_EQ(restarts("tcp://127.0.0.1:5555"), 1u) << "once: the restarted trainer has it set";
  EXPECT_EQ(restarts("ipc:///tmp/dsactor-no-such-service"), 1u);
  EXPECT_EQ(restarts("tcp://10.1.2.3:5555"), 0u) << "a service on another host";
  setenv("OMP_WAIT_POLICY", "active", 1);
  EXPECT_EQ(restarts("tcp://127.0.0.1:5555"), 0u) << "the user's choice stands";
  if (saved)
    setenv("OMP_WAIT_POLICY", saved->c_str(), 1);
  else
    unsetenv("OMP_WAIT_POLICY");
}

}  // namespace
}  // namespace dsactor
