// SIGTERM / SIGINT to `dsactor start --role trainer`: the engine actor finishes the current
// step, the run is checkpointed to --out, the exit code is 128 + signal, and resuming from
// that checkpoint ends with exactly the weights of an uninterrupted run. With two ranks a
// signal to one of them stops both after the same step.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "storage/safetensors.h"
#include "tests/cli/child_process.h"
#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor {
namespace {

using dsactor::testing::Child;
using dsactor::testing::free_port;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;

constexpr int kSteps = 400;

void write_inputs(const std::filesystem::path& dir) {
  std::string corpus;
  for (int i = 0; i < 300; ++i)
    corpus += "a stitch in time saves nine " + std::to_string(i % 11) + "\n";
  write_file(dir / "corpus.txt", corpus);
  write_file(dir / "ds.json", R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})");
  // ZeRO stage 3 without offload: the ZeRO engine, its partitions held by the rank itself.
  write_file(dir / "z3.json", R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "zero_optimization": {"stage": 3}})");
}

std::vector<std::string> trainer_args(const std::string& out, int steps,
                                      const std::string& config = "ds.json") {
  return testing::tiny_trainer_argv(config, out, steps);
}

// The step the log says the run stopped at.
int stopped_step(const std::string& log) {
  const auto at = log.find("stopped at step ");
  if (at == std::string::npos) return -1;
  return std::stoi(log.substr(at + 16));
}

// Stage 0 (ds.json) and ZeRO stage 3 with the partitions on the rank (z3.json).
class StartTrainerStopEngines : public ::testing::TestWithParam<const char*> {};

TEST_P(StartTrainerStopEngines, SigtermCheckpointsAndTheResumedRunEndsWithTheStraightRunsWeights) {
  TempDir dir;
  write_inputs(dir.path());
  const std::string config = GetParam();
  Child straight(dir.path(), trainer_args("straight", kSteps, config), dir.path() / "straight.log");
  ASSERT_EQ(straight.wait(std::chrono::seconds(300)), 0) << straight.log();

  Child run(dir.path(), trainer_args("cut", kSteps, config), dir.path() / "cut.log");
  ASSERT_TRUE(run.wait_for_out("step 5/", std::chrono::seconds(120))) << run.log();
  run.signal(SIGTERM);
  EXPECT_EQ(run.wait(std::chrono::seconds(120)), 128 + SIGTERM) << run.log();
  const int stop = stopped_step(run.log());
  ASSERT_GE(stop, 5) << run.log();
  ASSERT_LT(stop, kSteps) << "the run finished before the signal; nothing was tested";
  EXPECT_NE(run.log().find("SIGTERM received"), std::string::npos) << run.log();

  std::vector<std::string> resume = trainer_args("cut", kSteps, config);
  resume.insert(resume.end(), {"--resume", "cut"});
  Child resumed(dir.path(), resume, dir.path() / "resumed.log");
  ASSERT_EQ(resumed.wait(std::chrono::seconds(300)), 0) << resumed.log();
  EXPECT_NE(resumed.log().find("at step " + std::to_string(stop)), std::string::npos)
      << resumed.log();
  const auto a = storage::read_safetensors(dir.path() / "straight/model.safetensors");
  const auto b = storage::read_safetensors(dir.path() / "cut/model.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) EXPECT_TRUE(t.bytes == b.tensors.at(name).bytes) << name;
}

INSTANTIATE_TEST_SUITE_P(Engines, StartTrainerStopEngines, ::testing::Values("ds.json", "z3.json"),
                         [](const auto& info) {
                           return std::string(info.param) == "ds.json" ? "Stage0"
                                                                       : "Stage3OnTheRank";
                         });

TEST(StartTrainerStop, ASignalToOneRankStopsEveryRankAfterTheSameStep) {
  TempDir dir;
  write_inputs(dir.path());
  const std::string coordinator = "tcp://127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < 2; ++r) {
    auto args = trainer_args("out" + std::to_string(r), 100000);
    args.insert(args.end(), {"--rank", std::to_string(r), "--world-size", "2", "--coordinator",
                             coordinator, "--comm-timeout-ms", "60000"});
    if (r == 0) args.push_back("--serve-coordinator");
    for (const auto& k : dsactor::testing::shared_trainer_keys(dir.path())) args.push_back(k);
    ranks.push_back(std::make_unique<Child>(dir.path(), args,
                                            dir.path() / ("rank" + std::to_string(r) + ".log")));
  }
  ASSERT_TRUE(ranks[1]->wait_for_out("step 5/", std::chrono::seconds(120))) << ranks[1]->log();
  ranks[1]->signal(SIGINT);  // rank 1 only: rank 0 learns of it through the step's allreduce
  EXPECT_EQ(ranks[1]->wait(std::chrono::seconds(120)), 128 + SIGINT) << ranks[1]->log();
  const int rc0 = ranks[0]->wait(std::chrono::seconds(120));
  EXPECT_NE(rc0, 0) << ranks[0]->log();
  EXPECT_NE(rc0, -1) << "rank 0 did not stop: " << ranks[0]->log();
  const int s0 = stopped_step(ranks[0]->log()), s1 = stopped_step(ranks[1]->log());
  EXPECT_GE(s1, 5);
  EXPECT_EQ(s0, s1) << ranks[0]->log() << ranks[1]->log();
  // Rank 0 (the one that writes) saved the agreed step and named it in `latest`.
  const auto tag = "global_step" + std::to_string(s0);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "out0/checkpoint" / tag / "manifest.json"));
  EXPECT_EQ(dsactor::testing::read_file(dir.path() / "out0/checkpoint/latest"), tag);
}

}  // namespace
}  // namespace dsactor
