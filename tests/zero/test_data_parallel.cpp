// Data parallel through the real binary: two `dsactor start --role trainer` processes (rank
// 0 serving the rendezvous with the keypair both share and the run's token, Gloo over
// 127.0.0.1), each with its own offload service process where the config names offload (else
// the ranks hold the partitions), against `dsactor train` (stage 0, one process) with twice
// the micro-batch on the same seed and data.
//
// Why a tolerance: both runs see the same 2b rows per step and dloss = scale / (2b*T) in
// both, so every per-position gradient contribution is the same float; only the summation
// differs: one rank sums the 2b rows inside its kernels, two ranks each sum b rows and the
// reduce-scatter / allreduce adds the two halves (rank 0 + rank 1, fp32). That reordering
// changes gradients by a few ulps; over 20 Adam steps the losses stay within 1e-5 relative
// and the weights within 1e-4 absolute (Adam's update is lr * m / sqrt(v), so an ulp-sized
// gradient change moves an element by far less than lr = 2e-3 per step).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "deploy/service_process.h"
#include "security/curve_keys.h"
#include "storage/safetensors.h"
#include "tests/cli/child_process.h"
#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"
#include "tests/zero/weights_test_util.h"

namespace dsactor {
namespace {

using dsactor::testing::Child;
using dsactor::testing::free_port;
using dsactor::testing::read_file;
using dsactor::testing::run_dsactor;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;

constexpr int kSteps = 20;

std::vector<double> losses(const std::filesystem::path& csv) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);  // header
  std::vector<double> v;
  while (std::getline(in, line)) v.push_back(std::stod(line.substr(line.find(',') + 1)));
  return v;
}

std::string config(int micro_batch, const std::string& monitor, const std::string& zero) {
  return R"({"train_micro_batch_size_per_gpu": )" + std::to_string(micro_batch) +
         R"(, "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "weight_decay": 0.01}},
  "csv_monitor": {"enabled": true, "output_path": ")" +
         monitor + R"(", "job_name": "run"}, "zero_optimization": )" + zero + "}";
}

struct Reference {
  std::vector<double> losses;
  std::filesystem::path weights;
};

class DataParallel : public ::testing::TestWithParam<std::pair<const char*, const char*>> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string corpus;
    for (int i = 0; i < 300; ++i)
      corpus += "the quick brown fox " + std::to_string(i * 7 % 13) + " jumps over the lazy dog\n";
    write_file(dir_->path() / "corpus.txt", corpus);
    // One rank, micro-batch 4: the run two ranks with micro-batch 2 must reproduce.
    write_file(dir_->path() / "ref.json", config(4, "ref_monitor", R"({"stage": 0})"));
    const auto train =
        run_dsactor("train --config ref.json --model tiny --data corpus.txt --steps " +
                        std::to_string(kSteps) + " --out ref --sample 0",
                    dir_->path());
    ASSERT_EQ(train.exit_code, 0) << train.err;
    const auto exp = run_dsactor("export --checkpoint ref --to ref.safetensors", dir_->path());
    ASSERT_EQ(exp.exit_code, 0) << exp.err;
    ref_ = new Reference{losses(dir_->path() / "ref_monitor/run/Train_Samples_train_loss.csv"),
                         dir_->path() / "ref.safetensors"};
    ASSERT_EQ(ref_->losses.size(), static_cast<size_t>(kSteps));
  }
  static void TearDownTestSuite() {
    delete ref_;
    delete dir_;
  }
  static TempDir* dir_;
  static Reference* ref_;
};
TempDir* DataParallel::dir_ = nullptr;
Reference* DataParallel::ref_ = nullptr;

TEST_P(DataParallel, TwoRanksOfMicroBatchTwoLearnWhatOneRankOfFourLearns) {
  const auto [name, zero] = GetParam();
  const auto& dir = dir_->path();
  const std::string tag = name;
  write_file(dir / (tag + ".json"), config(2, tag + "_monitor", zero));
  const bool offload = std::string(zero).find("offload") != std::string::npos;
  std::vector<std::unique_ptr<deploy::ServiceProcess>> services;
  const std::vector<std::string> trainer_keys = dsactor::testing::shared_trainer_keys(dir);
  if (offload)
    for (int r = 0; r < 2; ++r) {
      // The ranks' shared key (they meet the rendezvous with it too) is the client key the
      // services admit.
      deploy::ServiceProcessOptions so;
      so.args = {"--no-mlock"};
      so.log_file = dir / (tag + "_service" + std::to_string(r) + ".log");
      so.extra_client_keys = {security::read_public_key_file(dir / "keys" / "job.key")};
      services.push_back(std::make_unique<deploy::ServiceProcess>(DSACTOR_BINARY, so));
    }
  const std::string coordinator = "tcp://127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = {"start",
                                     "--role",
                                     "trainer",
                                     "--config",
                                     tag + ".json",
                                     "--model",
                                     "tiny",
                                     "--data",
                                     "corpus.txt",
                                     "--steps",
                                     std::to_string(kSteps),
                                     "--rank",
                                     std::to_string(r),
                                     "--world-size",
                                     "2",
                                     "--coordinator",
                                     coordinator,
                                     "--comm-timeout-ms",
                                     "60000",
                                     "--job",
                                     tag,
                                     "--name",
                                     "rank" + std::to_string(r),
                                     "--out",
                                     tag + "_out"};
    if (r == 0) args.push_back("--serve-coordinator");
    args.insert(args.end(), trainer_keys.begin(), trainer_keys.end());
    if (offload) {
      args.insert(args.end(), {"--offload", services[r]->endpoint()});
      // The service's keys: the rank's own --secret-key above stays (it also meets the
      // rendezvous with it), so only the service's public key is added here.
      const auto keys = services[r]->trainer_flags();
      for (size_t i = 0; i + 1 < keys.size(); i += 2)
        if (keys[i] == "--offload-key") args.insert(args.end(), {keys[i], keys[i + 1]});
    }
    ranks.push_back(
        std::make_unique<Child>(dir, args, dir / (tag + "_rank" + std::to_string(r) + ".log")));
  }
  for (auto& r : ranks) ASSERT_EQ(r->wait(std::chrono::seconds(240)), 0) << r->log();
  EXPECT_NE(ranks[0]->log().find("rank 0 of 2"), std::string::npos) << ranks[0]->log();
  if (tag != "stage0") {
    // overlap_comm (set for stage 2, DeepSpeed's default for stage 3): every block's
    // reduce-scatter of every step ran behind the backward; without it none did.
    const bool overlap = tag.rfind("stage1", 0) != 0;
    const std::string none = " 0 reduce-scatters overlapped";
    EXPECT_EQ(ranks[0]->log().find(none) == std::string::npos, overlap) << ranks[0]->log();
  }
  if (offload)
    for (auto& r : ranks) {
      // Each rank's service is on this host: its reduce-scatters wrote their partitions
      // straight into push slots of the shared-memory arena.
      EXPECT_NE(r->log().find("shared-memory arena ("), std::string::npos) << r->log();
      EXPECT_EQ(r->log().find("(0 pushes in place"), std::string::npos) << r->log();
    }

  const auto dp = losses(dir / (tag + "_monitor/run/Train_Samples_train_loss.csv"));
  ASSERT_EQ(dp.size(), ref_->losses.size());
  double worst = 0;
  for (size_t i = 0; i < dp.size(); ++i) {
    const double rel = std::abs(dp[i] - ref_->losses[i]) / std::abs(ref_->losses[i]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-5) << "step " << i + 1 << ": " << dp[i] << " vs " << ref_->losses[i];
  }
  // Learning happened, so equal losses are not two runs that both stood still.
  EXPECT_LT(dp.back(), dp.front() - 0.5);

  const double worst_weight = dsactor::testing::max_weight_difference(
      dir / (tag + "_out/model.safetensors"), ref_->weights);
  EXPECT_LE(worst_weight, 1e-4);
  std::printf("%s: worst loss difference %.3g relative, worst weight difference %.3g\n", name,
              worst, worst_weight);
}

INSTANTIATE_TEST_SUITE_P(
    Stages, DataParallel,
    ::testing::Values(
        std::make_pair("stage0", R"({"stage": 0})"),
        std::make_pair("stage1", R"({"stage": 1, "offload_optimizer": {"device": "cpu"}})"),
        std::make_pair(
            "stage2",
            R"({"stage": 2, "offload_optimizer": {"device": "cpu"}, "overlap_comm": true})"),
        std::make_pair(
            "stage3",
            R"({"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}, "stage3_prefetch_bucket_size": 15000})"),
        // The ranks hold the partitions themselves: no offload service.
        std::make_pair("stage1_on_ranks", R"({"stage": 1})"),
        std::make_pair("stage2_on_ranks", R"({"stage": 2, "overlap_comm": true})"),
        std::make_pair("stage3_on_ranks", R"({"stage": 3, "stage3_prefetch_bucket_size": 15000})")),
    [](const auto& info) { return std::string(info.param.first); });

// Ranks from the launchers' environment instead of flags (and, last, from the coordinator
// when only --world-size is given): torchrun (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the master's
// address from SLURM_LAUNCH_NODE_IPADDR) and mpirun (OMPI_COMM_WORLD_*). Rank 0 serves the
// rendezvous at MASTER_ADDR:MASTER_PORT as torchrun's rank 0 hosts its store.
class LauncherEnvironment : public DataParallel {};

TEST_P(LauncherEnvironment, RanksFromTheEnvironmentTrainLikeRanksFromFlags) {
  const std::string launcher = GetParam().first;
  const auto& dir = dir_->path();
  write_file(dir / (launcher + ".json"), config(2, launcher + "_monitor", R"({"stage": 0})"));
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < 2; ++r) {
    const std::string rank = std::to_string(r);
    std::vector<std::string> env;
    if (launcher == "torchrun")
      env = {"RANK=" + rank, "WORLD_SIZE=2", "LOCAL_RANK=" + rank, "MASTER_ADDR=127.0.0.1",
             "MASTER_PORT=" + port};
    else if (launcher == "slurm")
      env = {"SLURM_PROCID=" + rank, "SLURM_NTASKS=2", "SLURM_LOCALID=" + rank,
             "SLURM_LAUNCH_NODE_IPADDR=127.0.0.1", "MASTER_PORT=" + port};
    else if (launcher == "openmpi")
      env = {"OMPI_COMM_WORLD_RANK=" + rank, "OMPI_COMM_WORLD_SIZE=2",
             "OMPI_COMM_WORLD_LOCAL_RANK=" + rank, "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port};
    std::vector<std::string> args = {
        "start", "--role", "trainer",    "--config", launcher + ".json",     "--model",
        "tiny",  "--data", "corpus.txt", "--steps",  std::to_string(kSteps), "--comm-timeout-ms",
        "60000"};
    if (launcher == "coordinator") {
      // No rank anywhere: the coordinator hands them out in joining order.
      args.insert(args.end(), {"--world-size", "2", "--coordinator", "tcp://127.0.0.1:" + port});
      if (r == 0) args.push_back("--serve-coordinator");
    }
    for (const auto& k : dsactor::testing::shared_trainer_keys(dir)) args.push_back(k);
    ranks.push_back(
        std::make_unique<Child>(dir, args, dir / (launcher + "_rank" + rank + ".log"), env));
  }
  for (auto& r : ranks) ASSERT_EQ(r->wait(std::chrono::seconds(240)), 0) << r->log();
  const std::string logs = ranks[0]->log() + ranks[1]->log();
  EXPECT_NE(logs.find("rank 0 of 2"), std::string::npos) << logs;
  EXPECT_NE(logs.find("rank 1 of 2"), std::string::npos) << logs;
  if (launcher == "coordinator") {
    EXPECT_NE(logs.find("the coordinator assigned rank"), std::string::npos) << logs;
  }
  const auto dp = losses(dir / (launcher + "_monitor/run/Train_Samples_train_loss.csv"));
  ASSERT_EQ(dp.size(), ref_->losses.size());
  for (size_t i = 0; i < dp.size(); ++i)
    EXPECT_LE(std::abs(dp[i] - ref_->losses[i]) / std::abs(ref_->losses[i]), 1e-5)
        << "step " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(Launchers, LauncherEnvironment,
                         ::testing::Values(std::make_pair("torchrun", ""),
                                           std::make_pair("slurm", ""),
                                           std::make_pair("openmpi", ""),
                                           std::make_pair("coordinator", "")),
                         [](const auto& info) { return std::string(info.param.first); });

// A rank that leaves mid-run: the other must stop within its collective timeout with an
// error naming the missing rank, not hang.
TEST(DataParallelFailure, ARankThatDiesStopsTheOtherWithAnErrorNamingIt) {
  TempDir dir;
  std::string corpus;
  for (int i = 0; i < 200; ++i)
    corpus += "sphinx of black quartz, judge my vow " + std::to_string(i % 7) + "\n";
  write_file(dir.path() / "corpus.txt", corpus);
  write_file(dir.path() / "dp.json", config(2, "monitor", R"({"stage": 0})"));
  const std::string coordinator = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto args = [&](int rank, int steps) {
    std::vector<std::string> a = {"start",
                                  "--role",
                                  "trainer",
                                  "--config",
                                  "dp.json",
                                  "--data",
                                  "corpus.txt",
                                  "--steps",
                                  std::to_string(steps),
                                  "--rank",
                                  std::to_string(rank),
                                  "--world-size",
                                  "2",
                                  "--coordinator",
                                  coordinator,
                                  "--comm-timeout-ms",
                                  "3000"};
    if (rank == 0) a.push_back("--serve-coordinator");
    for (const auto& k : dsactor::testing::shared_trainer_keys(dir.path())) a.push_back(k);
    return a;
  };
  Child rank0(dir.path(), args(0, 50), dir.path() / "rank0.log");
  Child rank1(dir.path(), args(1, 3), dir.path() / "rank1.log");  // leaves after 3 steps
  EXPECT_EQ(rank1.wait(std::chrono::seconds(120)), 0) << rank1.log();
  const int rc = rank0.wait(std::chrono::seconds(120));
  EXPECT_NE(rc, 0) << rank0.log();
  EXPECT_NE(rc, -1) << "rank 0 hung instead of failing: " << rank0.log();
  EXPECT_NE(rank0.log().find("rank 1"), std::string::npos) << rank0.log();
}

}  // namespace
}  // namespace dsactor
