// Resuming from the offload services' durable step, with real processes: a trainer killed
// after pushing a step's gradients (DSACTOR_TEST_CRASH_AT=gradients-pushed, before its commit)
// continues with `--resume` alone from the step its services hold, the leftover gradients
// dropped there, also after the NVMe service itself was killed and restarted on its
// directory; the run ends with the undisturbed run's weights bit for bit. A RAM-tier service
// that restarted holds nothing: `--resume` alone says so, `--resume CHECKPOINT` restores. A
// trainer whose NVMe service is killed and restarted under it reconnects and goes on. Two
// data-parallel ranks, each with its own service, killed in the middle of a step, continue
// with `--resume` alone too.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "deploy/service_process.h"
#include "storage/safetensors.h"
#include "tests/cli/child_process.h"
#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor {
namespace {

namespace fs = std::filesystem;
using dsactor::testing::Child;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;

constexpr auto kWait = std::chrono::seconds(300);
constexpr int kSteps = 10;

class ResumeFromServices : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string corpus;
    for (int i = 0; i < 300; ++i)
      corpus += "a stitch in time saves nine " + std::to_string(i % 11) + "\n";
    write_file(dir_.path() / "corpus.txt", corpus);
    write_file(dir_.path() / "z3offload.json",
               R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
                   "gradient_accumulation_steps": 2,
                   "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
                   "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                         "offload_param": {"device": "cpu"}}})");
  }

  // A service keeping its state in `name`/ (with `nvme`: its NVMe tier there too), with the
  // keys every service of the test shares (the job's owner is the one client key).
  // `listen`: the endpoint of the service it replaces.
  std::unique_ptr<deploy::ServiceProcess> start_service(
      const std::string& name, bool nvme, const std::string& listen = "",
      std::vector<std::pair<std::string, std::string>> env = {}) {
    deploy::ServiceProcessOptions so;
    so.env = std::move(env);
    so.args = {"--no-mlock", "--state-dir", (dir_.path() / name / "state").string()};
    if (!listen.empty()) so.args.insert(so.args.end(), {"--listen", listen});
    if (nvme) so.args.insert(so.args.end(), {"--nvme", (dir_.path() / name / "nvme").string()});
    so.log_file = dir_.path() / (name + "_" + std::to_string(++services_) + ".log");
    so.keys_dir = dir_.path() / "keys";
    fs::create_directories(dir_.path() / name);
    return std::make_unique<deploy::ServiceProcess>(DSACTOR_BINARY, so);
  }

  // The arguments of `start --role trainer` of job `job` on `service` to `steps` into `out`.
  static std::vector<std::string> trainer_args(const deploy::ServiceProcess& service,
                                               const std::string& job, const std::string& out,
                                               int steps) {
    std::vector<std::string> a = testing::tiny_trainer_argv("z3offload.json", out, steps);
    a.insert(a.end(), {"--job", job, "--offload", service.endpoint()});
    const auto keys = service.trainer_flags();
    a.insert(a.end(), keys.begin(), keys.end());
    return a;
  }

  // That run to kSteps, plus `more`; its exit code.
  int train(const deploy::ServiceProcess& service, const std::string& job, const std::string& out,
            std::vector<std::string> more, std::vector<std::string> env, std::string* log) {
    auto a = trainer_args(service, job, out, kSteps);
    a.insert(a.end(), more.begin(), more.end());
    Child child(dir_.path(), a, dir_.path() / (out + "_" + std::to_string(++runs_) + ".log"), env);
    const int rc = child.wait(kWait);
    *log = child.log();
    return rc;
  }

  bool same_weights(const std::string& a, const std::string& b) const {
    const auto x = storage::read_safetensors(dir_.path() / a / "model.safetensors");
    const auto y = storage::read_safetensors(dir_.path() / b / "model.safetensors");
    if (x.tensors.size() != y.tensors.size()) return false;
    for (const auto& [name, t] : x.tensors)
      if (!y.tensors.count(name) || t.bytes != y.tensors.at(name).bytes) return false;
    return true;
  }

  // Rank r of job `job` on services[r], to kSteps; rank 0 serves the rendezvous on `port`.
  std::vector<std::string> rank_args(
      const std::vector<std::unique_ptr<deploy::ServiceProcess>>& services, int r,
      const std::string& job, const std::string& port) const {
    const auto keys = dir_.path() / "keys";
    auto a = testing::tiny_trainer_argv("z3offload.json", job, kSteps);
    a.insert(a.end(), {"--job",
                       job,
                       "--offload",
                       services[r]->endpoint(),
                       "--offload-key",
                       (keys / "service.key").string(),
                       "--secret-key",
                       (keys / "client.key_secret").string(),
                       "--coordinator-key",
                       (keys / "client.key").string(),
                       "--job-token-file",
                       (dir_.path() / "job.token").string(),
                       "--rank",
                       std::to_string(r),
                       "--world-size",
                       "2",
                       "--coordinator",
                       "tcp://127.0.0.1:" + port,
                       "--comm-timeout-ms",
                       "5000"});
    if (r == 0) a.push_back("--serve-coordinator");
    return a;
  }
  // Both ranks of `job`, plus `more`, with `env`: their exit codes and logs (rank 0's, rank 1's).
  std::pair<std::vector<int>, std::vector<std::string>> run_two_ranks(
      const std::vector<std::unique_ptr<deploy::ServiceProcess>>& services, const std::string& job,
      const std::vector<std::string>& more, const std::vector<std::string>& env) {
    testing::make_job_token_file(dir_.path() / "job.token");
    const std::string port = std::to_string(testing::free_port());
    std::vector<std::unique_ptr<Child>> ranks;
    for (int r = 0; r < 2; ++r) {
      auto a = rank_args(services, r, job, port);
      a.insert(a.end(), more.begin(), more.end());
      ranks.push_back(std::make_unique<Child>(
          dir_.path(), a,
          dir_.path() /
              (job + "_rank" + std::to_string(r) + "_" + std::to_string(++runs_) + ".log"),
          env));
    }
    std::pair<std::vector<int>, std::vector<std::string>> out;
    for (auto& c : ranks) {
      out.first.push_back(c->wait(kWait));
      out.second.push_back(c->log());
    }
    return out;
  }

  TempDir dir_;
  int runs_ = 0, services_ = 0;
};

const std::vector<std::string> kCrashAtStep5 = {"DSACTOR_TEST_CRASH_AT=gradients-pushed:5"};

TEST_F(ResumeFromServices, AKilledTrainerContinuesFromTheDurableStepBitForBit) {
  auto service = start_service("nvme-service", true);
  std::string log;
  ASSERT_EQ(train(*service, "straight", "straight", {}, {}, &log), 0) << log;

  // Killed with step 5's gradients on the service, uncommitted; no checkpoint anywhere.
  ASSERT_EQ(train(*service, "cut", "cut", {}, kCrashAtStep5, &log), 128 + SIGKILL) << log;
  // A fresh run of the job is still refused; --resume alone continues from step 4, the
  // leftover gradients of step 5 dropped first (they used to block every resume). Killed
  // again at the resumed run's 2nd step (step 6), after its pushes.
  ASSERT_NE(train(*service, "cut", "cut", {}, {}, &log), 0) << log;
  EXPECT_NE(log.find("already holds job 'cut' at step 4"), std::string::npos) << log;
  ASSERT_EQ(train(*service, "cut", "cut", {"--resume"},
                  {"DSACTOR_TEST_CRASH_AT=gradients-pushed:2"}, &log),
            128 + SIGKILL)
      << log;
  EXPECT_NE(log.find("resumed from the offload services at step 4"), std::string::npos) << log;
  EXPECT_NE(service->log().find("job 'cut' resumed at step 4"), std::string::npos)
      << service->log();

  // The service dies too (kill -9) and comes back on its NVMe directory: the job's step 5,
  // its record and its partitions come back from RocksDB and the extents.
  service.reset();
  service = start_service("nvme-service", true);
  EXPECT_NE(service->log().find("reloaded job 'cut'"), std::string::npos) << service->log();
  ASSERT_EQ(train(*service, "cut", "cut", {"--resume"}, {}, &log), 0) << log;
  EXPECT_NE(log.find("resumed from the offload services at step 5"), std::string::npos) << log;
  EXPECT_NE(log.find("durably (NVMe)"), std::string::npos) << log;
  EXPECT_TRUE(same_weights("cut", "straight"));
}

TEST_F(ResumeFromServices, ARestartedRamServiceHoldsNothingAndTheCheckpointIsRestored) {
  auto service = start_service("ram-service", false);
  std::string log;
  ASSERT_EQ(train(*service, "straight", "straight", {}, {}, &log), 0) << log;
  // Killed in step 7: the save of step 4 is published (`latest`) by the end of step 6 at
  // the latest (when the save of step 6 is due, the trainer waits for the one before), and
  // the save of step 6 cannot be published before the end of step 7, whenever its write
  // ends: so `latest` names step 4 however fast the service writes.
  ASSERT_EQ(train(*service, "cut", "cut", {"--checkpoint-every", "2"},
                  {"DSACTOR_TEST_CRASH_AT=gradients-pushed:7"}, &log),
            128 + SIGKILL)
      << log;
  // The RAM service restarts: the job is gone with the process.
  service.reset();
  service = start_service("ram-service", false);
  ASSERT_NE(train(*service, "cut", "cut", {"--resume"}, {}, &log), 0) << log;
  EXPECT_NE(log.find("--resume without a checkpoint"), std::string::npos) << log;
  EXPECT_NE(log.find("a RAM-tier service has no durable step"), std::string::npos) << log;
  ASSERT_EQ(train(*service, "cut", "cut", {"--resume", "cut"}, {}, &log), 0) << log;
  EXPECT_NE(log.find("restoring the checkpoint"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from cut at step 4"), std::string::npos) << log;
  EXPECT_TRUE(same_weights("cut", "straight"));
}

// With offload_optimizer.update_at_push the service runs each partition's update on its
// push: a trainer killed after step 7's pushes leaves step 7 partly applied on the RAM
// service, which stayed up. A new session gets no step to continue from there (a run
// resumed from the services' step would redo step 7 on half-updated parameters), so
// --resume alone fails naming it, and --resume with the checkpoint restores step 4 and ends
// with the undisturbed run's weights bit for bit; without a checkpoint, --resume-or-start
// runs the job again from step 0.
TEST_F(ResumeFromServices, AStepUpdatedAtItsPushesIsRestoredFromACheckpointNotResumed) {
  write_file(dir_.path() / "z3uap.json",
             R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
                 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
                 "zero_optimization": {"stage": 3,
                                       "offload_optimizer": {"device": "cpu",
                                                             "update_at_push": true},
                                       "offload_param": {"device": "cpu"}}})");
  auto service = start_service("ram-service", false);
  auto run = [&](const std::string& job, std::vector<std::string> more,
                 std::vector<std::string> env, std::string* log) {
    auto a = trainer_args(*service, job, job, kSteps);
    std::replace(a.begin(), a.end(), std::string("z3offload.json"), std::string("z3uap.json"));
    a.insert(a.end(), more.begin(), more.end());
    Child child(dir_.path(), a, dir_.path() / (job + "_" + std::to_string(++runs_) + ".log"), env);
    const int rc = child.wait(kWait);
    *log = child.log();
    return rc;
  };
  std::string log;
  ASSERT_EQ(run("straight", {}, {}, &log), 0) << log;
  ASSERT_EQ(
      run("cut", {"--checkpoint-every", "2"}, {"DSACTOR_TEST_CRASH_AT=gradients-pushed:7"}, &log),
      128 + SIGKILL)
      << log;
  ASSERT_NE(run("cut", {"--resume"}, {}, &log), 0) << log;
  EXPECT_NE(log.find("--resume without a checkpoint"), std::string::npos) << log;
  EXPECT_NE(service->log().find("job 'cut' resumed by a new session, but step 7 is partly "
                                "applied"),
            std::string::npos)
      << service->log();
  ASSERT_EQ(run("cut", {"--resume", "cut"}, {}, &log), 0) << log;
  EXPECT_NE(log.find("resumed from cut at step 4"), std::string::npos) << log;
  EXPECT_TRUE(same_weights("cut", "straight"));
  // Without a checkpoint, --resume-or-start begins the job again at step 0.
  ASSERT_EQ(run("over", {}, {"DSACTOR_TEST_CRASH_AT=gradients-pushed:3"}, &log), 128 + SIGKILL)
      << log;
  ASSERT_EQ(run("over", {"--resume-or-start"}, {}, &log), 0) << log;
  EXPECT_NE(log.find("starting at step 0"), std::string::npos) << log;
  EXPECT_TRUE(same_weights("over", "straight"));
}

// kill -9 of the NVMe service under a running trainer, restarted on the same endpoint and
// directory: the trainer's heartbeats find it gone, it reconnects, maps its arena again,
// re-registers, redoes the step in flight from the durable step, and ends with the
// undisturbed run's weights bit for bit.
TEST_F(ResumeFromServices, ATrainerSurvivesARestartOfItsNvmeService) {
  constexpr int kLongSteps = 60;
  auto service = start_service("nvme-service", true);
  const std::string endpoint = service->endpoint();
  Child straight(dir_.path(), trainer_args(*service, "straight", "straight", kLongSteps),
                 dir_.path() / "straight.log");
  ASSERT_EQ(straight.wait(kWait), 0) << straight.log();

  auto args = trainer_args(*service, "live", "live", kLongSteps);
  args.insert(args.end(), {"--heartbeat-ms", "200", "--service-timeout-ms", "5000",
                           "--reconnect-attempts", "6"});
  Child live(dir_.path(), args, dir_.path() / "live.log");
  ASSERT_TRUE(live.wait_for_out("step 3/", kWait)) << live.log();
  service.reset();  // kill -9
  service = start_service("nvme-service", true, endpoint);
  ASSERT_EQ(live.wait(kWait), 0) << live.log();
  EXPECT_NE(live.log().find("reconnecting to the offload services"), std::string::npos)
      << "the run ended before the service was killed: nothing was tested\n"
      << live.log();
  EXPECT_NE(live.log().find("reconnected; continuing after step"), std::string::npos) << live.log();
  EXPECT_TRUE(same_weights("live", "straight"));
}

// Data parallel, no checkpoint: two ranks, each with its own service, killed with step 5's
// gradients pushed and its verdict reached, before either commits (a kill between one
// rank's commit and the other's leaves the services at different steps, which only a
// checkpoint recovers from). Both services hold step 4, so `--resume` alone continues both
// ranks from there, the leftover gradients dropped, and the run ends with the undisturbed
// run's weights bit for bit.
TEST_F(ResumeFromServices, TwoDataParallelRanksContinueFromTheirServicesStep) {
  std::vector<std::unique_ptr<deploy::ServiceProcess>> services;
  for (int r = 0; r < 2; ++r) services.push_back(start_service("rank" + std::to_string(r), false));
  const auto run = [&](const std::string& job, const std::vector<std::string>& more,
                       const std::vector<std::string>& env) {
    return run_two_ranks(services, job, more, env);
  };
  auto [straight, straight_logs] = run("straight", {}, {});
  ASSERT_EQ(straight, (std::vector<int>{0, 0})) << straight_logs[0] << straight_logs[1];

  auto [cut, cut_logs] = run("cut", {}, kCrashAtStep5);
  ASSERT_EQ(cut, (std::vector<int>{128 + SIGKILL, 128 + SIGKILL})) << cut_logs[0] << cut_logs[1];
  EXPECT_FALSE(fs::exists(dir_.path() / "cut/model.safetensors")) << "the run was not cut";

  auto [resumed, resumed_logs] = run("cut", {"--resume"}, {});
  const std::string resumed_log = resumed_logs[0] + resumed_logs[1];
  ASSERT_EQ(resumed, (std::vector<int>{0, 0})) << resumed_log;
  EXPECT_NE(resumed_log.find("resumed from the offload services at step 4"), std::string::npos)
      << resumed_log;
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(services[r]->log().find("job 'cut-rank" + std::to_string(r) + "' resumed at step 4"),
              std::string::npos)
        << services[r]->log();
  EXPECT_TRUE(same_weights("cut", "straight"));
}

// Data parallel, a periodic save one rank's service writes slowly (its background write
// held back): the trainers go on stepping, and both ranks publish the save (their part
// committed, `latest` replaced) at the same later step, the first boundary at which both
// parts are written, so `latest` never names a tag one rank has not finished.
TEST_F(ResumeFromServices, TwoDataParallelRanksPublishASlowSaveAtTheSameStep) {
  std::vector<std::unique_ptr<deploy::ServiceProcess>> services;
  services.push_back(start_service("rank0", false));
  services.push_back(
      start_service("rank1", false, "", {{"DSACTOR_TEST_PAUSE_AT", "background-checkpoint:3000"}}));
  auto [rc, logs] =
      run_two_ranks(services, "dp", {"--checkpoint-every", "4", "--keep-last", "0"}, {});
  ASSERT_EQ(rc, (std::vector<int>{0, 0})) << logs[0] << logs[1];
  const int at0 = testing::published_at_step(logs[0], "global_step4");
  EXPECT_EQ(at0, testing::published_at_step(logs[1], "global_step4")) << logs[0] << logs[1];
  EXPECT_GT(at0, 5) << "the save held the trainers at the next boundary: " << logs[0];
  EXPECT_LE(at0, 8) << logs[0];  // at the latest when the next save is due
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(fs::exists(dir_.path() / "dp/checkpoint/global_step4" /
                           ("rank-" + std::to_string(r)) / "trainer/manifest.json"));
  EXPECT_EQ(testing::read_file(dir_.path() / "dp/checkpoint/latest"), "global_step10");
}

}  // namespace
}  // namespace dsactor
