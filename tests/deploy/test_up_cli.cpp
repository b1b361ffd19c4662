// `dsactor up` through the real binary: dry run, config errors, a refused trainer, a service
// that cannot bind, SIGTERM and SIGKILL of `up` itself; never a process left behind.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/cli/child_process.h"
#include "tests/deploy/deploy_test_util.h"

extern char** environ;

namespace dsactor::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// `dsactor up ARGS` in the background, stdout/stderr in dir/up.out and dir/up.err.
class UpProcess : public DsactorProcess {
 public:
  UpProcess(const TempDir& dir, std::vector<std::string> args)
      : DsactorProcess(with_up(std::move(args)), dir / "up.out", dir / "up.err") {}

 private:
  static std::vector<std::string> with_up(std::vector<std::string> args) {
    args.insert(args.begin(), "up");
    return args;
  }
};

void expect_gone(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) EXPECT_TRUE(wait_gone(p, 30s)) << "pid " << p << " survived";
}

class UpCli : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(dir / "ds.json", R"({"train_micro_batch_size_per_gpu": 4})");
    port = free_port();
    endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  }
  std::filesystem::path deploy(const std::string& yaml) {
    write_file(dir / "deploy.yaml", yaml);
    return dir / "deploy.yaml";
  }
  std::string offload_role() const {
    return "  - {role: offload, name: offload0, listen: \"" + endpoint +
           "\", mlock: false, memory_limit: 64MiB}\n";
  }

  TempDir dir;
  int port = 0;
  std::string endpoint;
};

// The default run is authenticated: the dry run shows the per-run keys each role gets and
// never the token; --make-keys writes the keys of a keys_dir and starts nothing; plain mode
// is said out loud.
TEST_F(UpCli, KeysAreMadePerRunTheDryRunShowsThemAndMakeKeysWritesThem) {
  const std::string trainers =
      "  - {role: trainer, name: t0, config: ds.json, steps: 3}\n"
      "  - {role: trainer, name: t1, config: ds.json, steps: 3}\n";
  const auto file = deploy("job: k\nroles:\n" + offload_role() + trainers);
  UpProcess dry(dir, {file.string(), "--dry-run"});
  ASSERT_EQ(dry.wait(30s), 0) << dry.err();
  EXPECT_THAT(dry.out(), AllOf(HasSubstr("# keys in <run keys> (a fresh 0700 directory per run)"),
                               HasSubstr("--secret-key '<run keys>/t1.key_secret'"),
                               HasSubstr("--coordinator-key '<run keys>/t0.key'"),
                               HasSubstr("--offload-key '<run keys>/offload0.key'"),
                               HasSubstr("'DSACTOR_JOB_TOKEN=<token>'")));

  const auto kept = deploy(
      "job: k\nsecurity: {keys_dir: keys, job_token_file: run.token}\n"
      "roles:\n" +
      offload_role() + trainers);
  UpProcess make(dir, {kept.string(), "--make-keys"});
  ASSERT_EQ(make.wait(30s), 0) << make.err();
  for (const char* f :
       {"keys/offload0.key_secret", "keys/offload0.key", "keys/offload0.authorized",
        "keys/t0.key_secret", "keys/t0.authorized", "keys/t1.key_secret", "run.token"})
    EXPECT_TRUE(std::filesystem::exists(dir / f)) << f;
  EXPECT_THAT(make.out(), HasSubstr("[t0] secret " + (dir / "keys/t0.key_secret").string()));
  EXPECT_TRUE(make.children().empty());  // nothing started

  const auto plain = deploy("security: {insecure: true}\nroles:\n" + offload_role());
  UpProcess insecure(dir, {plain.string(), "--dry-run"});
  ASSERT_EQ(insecure.wait(30s), 0) << insecure.err();
  EXPECT_THAT(insecure.err(), HasSubstr("WITHOUT authentication"));
  EXPECT_THAT(insecure.out(), AllOf(HasSubstr("--insecure"), Not(HasSubstr("--secret-key"))));
}

TEST_F(UpCli, DryRunPrintsEveryCommandLineAndStartsNothing) {
  const auto file = deploy("job: demo\nroles:\n" + offload_role() +
                           "  - {role: trainer, config: ds.json, steps: 3}\n");
  UpProcess up(dir, {file.string(), "--dry-run"});
  ASSERT_EQ(up.wait(20s), 0) << up.err();
  EXPECT_THAT(up.out(),
              AllOf(HasSubstr("[offload0] DSACTOR_JOB=demo DSACTOR_ROLE_NAME=offload0 "),
                    HasSubstr("start --role offload --listen " + endpoint),
                    HasSubstr("[trainer0] "), HasSubstr("start --role trainer --name trainer0"),
                    HasSubstr("--offload " + endpoint), HasSubstr("--steps 3")));
  EXPECT_TRUE(up.children().empty());
}

// `restart: on-failure` without a checkpoint directory: a trainer whose ds_config puts its
// state on the offload services may be restarted (it continues from their committed step);
// one that keeps its optimizer state itself is refused, naming the key and the ds_config.
TEST_F(UpCli, ARestartWithoutCheckpointsNeedsTheTrainersStateOnItsServices) {
  write_file(dir / "zero3.json",
             R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3,
                 "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})");
  write_file(dir / "zero1.json",
             R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}})");
  const auto on_services = deploy("restart: on-failure\nroles:\n" + offload_role() +
                                  "  - {role: trainer, config: zero3.json, steps: 3}\n");
  UpProcess ok(dir, {on_services.string(), "--dry-run"});
  EXPECT_EQ(ok.wait(30s), 0) << ok.err();
  for (const char* config : {"ds.json", "zero1.json"}) {
    const auto on_trainer = deploy("restart: on-failure\nroles:\n" + offload_role() +
                                   "  - {role: trainer, config: " + config + ", steps: 3}\n");
    UpProcess refused(dir, {on_trainer.string(), "--dry-run"});
    EXPECT_EQ(refused.wait(30s), 2) << config;
    EXPECT_THAT(refused.err(), AllOf(HasSubstr(on_trainer.string() + ": roles[1].restart"),
                                     HasSubstr("checkpoint.dir"), HasSubstr(config),
                                     HasSubstr("offload_optimizer")));
    EXPECT_TRUE(refused.children().empty());
  }
}

TEST_F(UpCli, InvalidDeployFileExits2NamingFileKeyAndFix) {
  const auto file = deploy("roles:\n  - {role: ofload}\n");
  UpProcess up(dir, {file.string()});
  EXPECT_EQ(up.wait(20s), 2);
  EXPECT_THAT(up.err(), AllOf(HasSubstr(file.string() + ":2:"), HasSubstr("roles[0].role"),
                              HasSubstr("did you mean \"offload\"?")));
  EXPECT_TRUE(up.children().empty());
}

TEST_F(UpCli, RefusedTrainerStopsTheServiceAndIsNamed) {
  const auto file = deploy("roles:\n" + offload_role() + "  - {role: trainer, config: ds.json}\n");
  UpProcess up(dir, {file.string()});
  const int rc = up.wait(25s);
  EXPECT_EQ(rc, 101) << up.err();  // 100 + index of the trainer in roles
  EXPECT_THAT(up.err(), HasSubstr("role \"trainer0\""));
  // The service came up, was ready, and was stopped cleanly on the trainer's failure.
  EXPECT_THAT(up.out(), AllOf(HasSubstr("[offload0] "), HasSubstr("listening on " + endpoint),
                              HasSubstr("offload service stopped")));
  const auto kids = up.children();
  EXPECT_EQ(kids.size(), 2u) << up.err();
  expect_gone(kids);
}

TEST_F(UpCli, ServiceThatCannotBindIsNamed) {
  // Someone else holds the port: `up` says so before starting the service.
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(s, 8), 0);
  const auto file = deploy("roles:\n" + offload_role());
  UpProcess up(dir, {file.string()});
  const int rc = up.wait(25s);
  ::close(s);
  EXPECT_EQ(rc, 100) << up.err();
  EXPECT_THAT(up.err(), AllOf(HasSubstr("role \"offload0\""),
                              HasSubstr(endpoint + " is taken by another process")));
  EXPECT_TRUE(up.children().empty());
}

TEST_F(UpCli, SigtermStopsAServicesOnlyDeployment) {
  const auto file = deploy("roles:\n" + offload_role());
  UpProcess up(dir, {file.string()});
  ASSERT_TRUE(up.wait_for_out("listening on " + endpoint, 60s)) << up.err();
  const auto kids = up.children();
  ASSERT_EQ(kids.size(), 1u);
  EXPECT_TRUE(process_alive(kids[0]));
  ::kill(up.pid(), SIGTERM);
  EXPECT_EQ(up.wait(15s), 128 + SIGTERM) << up.err();
  EXPECT_THAT(up.out(), HasSubstr("[offload0] "));
  EXPECT_THAT(up.out(), HasSubstr("offload service stopped"));
  EXPECT_THAT(up.err(), Not(HasSubstr("SIGKILL")));
  expect_gone(kids);
}

TEST_F(UpCli, SigkillOfUpTakesItsChildrenAlong) {
  const auto file = deploy("roles:\n" + offload_role());
  UpProcess up(dir, {file.string()});
  ASSERT_TRUE(up.wait_for_out("listening on " + endpoint, 60s)) << up.err();
  const auto kids = up.children();
  ASSERT_EQ(kids.size(), 1u);
  ::kill(up.pid(), SIGKILL);
  EXPECT_EQ(up.wait(10s), 128 + SIGKILL);
  expect_gone(kids);  // PR_SET_PDEATHSIG
}

}  // namespace
}  // namespace dsactor::testing
