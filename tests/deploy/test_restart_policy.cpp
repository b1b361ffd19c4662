// Restart policies: the deploy file's keys (defaults, per-role overrides, errors with the
// nearest choice, the checks that span roles), the restart groups and a restarted trainer's
// command line; and the Supervisor restarting real children (small shell scripts): a worker
// restarted with its restart argv until it succeeds, the run failing past max_restarts, and
// a service's group stopped and started again (service ready first) while a child outside
// the group runs on untouched. The tests wait on events (files a child writes, its exit) and
// assert what happened and in which order, never how long it took.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "deploy/deploy_config.h"
#include "deploy/supervisor.h"
#include "tests/deploy/deploy_file_test.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::deploy {
namespace {

using dsactor::testing::TempDir;
using dsactor::testing::write_file;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

using RestartConfigTest = DeployFileTest;

TEST_F(RestartConfigTest, NeverByDefaultAndTheTopLevelIsEveryRolesDefault) {
  const auto plain = load("roles: [{role: offload}, {role: trainer, config: ds.json}]");
  EXPECT_EQ(plain.roles[0].restart, RestartMode::kNever);
  EXPECT_EQ(plain.roles[1].restart, RestartMode::kNever);
  EXPECT_EQ(plain.roles[0].max_restarts, kDefaultMaxRestarts);

  const auto cfg = load(R"(
restart: on-failure
max_restarts: 7
restart_backoff: 0.5
restart_backoff_max: 4
checkpoint: {dir: ckpt}
roles:
  - {role: offload, restart: never}
  - {role: trainer, config: ds.json, max_restarts: 2, restart_backoff_max: 8}
)");
  EXPECT_EQ(cfg.roles[0].restart, RestartMode::kNever);
  EXPECT_EQ(cfg.roles[0].max_restarts, 7);
  EXPECT_EQ(cfg.roles[1].restart, RestartMode::kOnFailure);
  EXPECT_EQ(cfg.roles[1].max_restarts, 2);
  EXPECT_EQ(cfg.roles[1].restart_backoff, 0.5);
  EXPECT_EQ(cfg.roles[1].restart_backoff_max, 8);
}

TEST_F(RestartConfigTest, BadValuesNameTheKeyAndWhatIsAllowed) {
  EXPECT_THAT(error_of("restart: on-falure\nroles: [{role: offload}]"),
              AllOf(HasSubstr("deploy.yaml:1"), HasSubstr("restart"), HasSubstr("on-failure")));
  EXPECT_THAT(error_of("roles: [{role: offload, max_restart: 2}]"),
              AllOf(HasSubstr("roles[0].max_restart"), HasSubstr("max_restarts")));
  EXPECT_THAT(error_of("roles: [{role: offload, max_restarts: -1}]"),
              HasSubstr("roles[0].max_restarts"));
  EXPECT_THAT(error_of("restart_backoff: 5\nrestart_backoff_max: 1\nroles: [{role: offload}]"),
              AllOf(HasSubstr("roles[0].restart_backoff_max"), HasSubstr("below restart_backoff")));
}

TEST_F(RestartConfigTest, ARestartedTrainerNeedsCheckpointsAndDataParallelRanksASharedDirectory) {
  EXPECT_THAT(error_of("roles: [{role: trainer, config: ds.json, restart: on-failure}]"),
              AllOf(HasSubstr("roles[0].restart"), HasSubstr("checkpoint.dir")));
  // Its out directory will do for one trainer...
  EXPECT_NO_THROW(load("roles: [{role: trainer, config: ds.json, restart: on-failure, out: o}]"));
  // ...but ranks must resume from one step, which one shared directory records.
  EXPECT_THAT(
      error_of(R"(
restart: on-failure
roles:
  - {role: trainer, config: ds.json, out: o}
  - {role: trainer, config: ds.json, out: o}
)"),
      AllOf(HasSubstr("roles[0].restart"), HasSubstr("world_size 2"), HasSubstr("checkpoint.dir")));
}

std::vector<std::string> names(const std::vector<const RoleSpec*>& roles) {
  std::vector<std::string> out;
  for (const auto* r : roles) out.push_back(r->name);
  return out;
}

TEST_F(RestartConfigTest, GroupsAndARestartedTrainersCommandLine) {
  const auto cfg = load(R"(
restart: on-failure
checkpoint: {dir: ckpt}
roles:
  - {role: offload, name: a}
  - {role: offload, name: b}
  - {role: offload, name: spare}
  - {role: coordinator}
  - {role: trainer, name: t0, config: ds.json, offload: [a]}
  - {role: trainer, name: t1, config: ds.json, offload: [b]}
)");
  // A trainer's group leaves every service (and its state) running; a service's takes the
  // trainers (and the coordinator) with it, and no other service.
  EXPECT_THAT(names(restart_group(cfg, cfg.roles[4])), ElementsAre("coordinator0", "t0", "t1"));
  EXPECT_THAT(names(restart_group(cfg, cfg.roles[0])),
              ElementsAre("a", "coordinator0", "t0", "t1"));
  EXPECT_THAT(names(restart_group(cfg, cfg.roles[1])),
              ElementsAre("b", "coordinator0", "t0", "t1"));
  EXPECT_THAT(names(restart_group(cfg, cfg.roles[2])), ElementsAre("spare"));  // no clients

  const auto children = children_for(cfg, "dsactor", "token");
  const ChildSpec& t0 = children[4];
  EXPECT_TRUE(t0.restart.on_failure);
  EXPECT_THAT(t0.restart_group, ElementsAre("coordinator0", "t1"));
  ASSERT_TRUE(t0.restart_argv);
  // No checkpoint yet: it starts over, dropping what the services hold of its job.
  auto argv = t0.restart_argv();
  EXPECT_EQ(argv.back(), "--overwrite");
  EXPECT_TRUE(std::equal(t0.argv.begin(), t0.argv.end(), argv.begin()));
  std::filesystem::create_directories(dir / "ckpt");
  write_file(dir / "ckpt/latest", "global_step4");
  argv = t0.restart_argv();
  ASSERT_GE(argv.size(), 2u);
  EXPECT_EQ(argv[argv.size() - 2], "--resume");
  EXPECT_EQ(argv.back(), (dir / "ckpt").string());
  EXPECT_FALSE(children[0].restart_argv);  // a service comes back with the same arguments
}

TEST_F(RestartConfigTest, ATrainerWhoseStateIsOnItsServicesNeedsNoCheckpoint) {
  // With offload services the file alone cannot say: `dsactor up` reads the ds_config...
  auto cfg = load(R"(
restart: on-failure
roles:
  - {role: offload}
  - {role: trainer, config: ds.json}
)");
  EXPECT_THROW(check_restart_sources(cfg), DeployConfigError);  // ...state on the trainer
  cfg.roles[1].state_on_services = true;
  EXPECT_NO_THROW(check_restart_sources(cfg));
  // ...and without a checkpoint to restore, the restart continues from the services' step,
  // or starts over when they hold none.
  const auto children = children_for(cfg, "dsactor", "token");
  ASSERT_TRUE(children[1].restart_argv);
  EXPECT_EQ(children[1].restart_argv().back(), "--resume-or-start");
  // Ranks still need a shared checkpoint: a kill between their commits leaves their
  // services a step apart.
  EXPECT_THAT(
      error_of(R"(
restart: on-failure
roles:
  - {role: offload}
  - {role: trainer, config: ds.json}
  - {role: trainer, config: ds.json}
)"),
      AllOf(HasSubstr("roles[1].restart"), HasSubstr("world_size 2"), HasSubstr("checkpoint.dir")));
}

TEST(RestartPolicy, BackoffDoublesUpToItsMaximum) {
  RestartPolicy p;
  p.backoff = 100ms;
  p.backoff_max = 350ms;
  EXPECT_EQ(p.delay(1), 100ms);
  EXPECT_EQ(p.delay(2), 200ms);
  EXPECT_EQ(p.delay(3), 350ms);
  EXPECT_EQ(p.delay(60), 350ms);
}

ChildSpec sh(const std::string& name, const std::string& script, bool service = false,
             int index = 0) {
  ChildSpec c;
  c.name = name;
  c.argv = {"sh", "-c", script, name};
  c.service = service;
  c.code_index = index;
  c.startup_timeout = 30s;
  c.shutdown_timeout = 5s;
  return c;
}

RestartPolicy on_failure(int max_restarts) {
  RestartPolicy p;
  p.on_failure = true;
  p.max_restarts = max_restarts;
  p.backoff = 1ms;
  p.backoff_max = 10ms;
  return p;
}

struct Run {
  SupervisorResult result;
  std::vector<std::string> lines;
};

Run run(std::vector<ChildSpec> children) {
  Run r;
  SupervisorOptions opt;
  opt.sink = [&r](std::string_view l) { r.lines.emplace_back(l); };
  opt.probe_interval = 20ms;
  Supervisor sup(std::move(children), opt);
  r.result = sup.run();
  return r;
}

// A worker that fails twice (a counter file), then succeeds: restarted with its restart argv.
TEST(SupervisorRestart, AFailedWorkerIsRestartedWithItsRestartArgvUntilItSucceeds) {
  TempDir dir;
  const std::string count = (dir / "count").string();
  auto w = sh("w", "n=$(cat " + count + " 2>/dev/null || echo 0); n=$((n+1)); echo $n > " + count +
                       "; echo \"run $n args: $*\"; [ $n -ge 3 ]");
  w.restart = on_failure(2);
  w.restart_argv = [argv = w.argv] {
    auto a = argv;
    a.push_back("--resume");
    return a;
  };
  const auto r = run({w});
  EXPECT_EQ(r.result.exit_code, 0) << r.result.message;
  EXPECT_THAT(r.lines, Contains("[w] run 1 args: "));
  EXPECT_THAT(r.lines, Contains("[w] run 2 args: --resume"));
  EXPECT_THAT(r.lines, Contains("[w] run 3 args: --resume"));
}

TEST(SupervisorRestart, PastMaxRestartsTheRunFailsSayingSo) {
  TempDir dir;
  const std::string runs = (dir / "runs").string();
  auto w = sh("w", "echo ran >> " + runs + "; echo broken >&2; exit 3", false, 4);
  w.restart = on_failure(2);
  const auto r = run({w});
  EXPECT_EQ(r.result.exit_code, 104);
  EXPECT_EQ(r.result.failed, "w");
  EXPECT_THAT(r.result.message, AllOf(HasSubstr("exited with code 3"), HasSubstr("2 restart(s)"),
                                      HasSubstr("max_restarts is 2"), HasSubstr("broken")));
  EXPECT_EQ(testing::read_file(runs), "ran\nran\nran\n");
}

TEST(SupervisorRestart, WithoutAPolicyAFailureStillEndsTheRun) {
  TempDir dir;
  const auto r = run({sh("w", "echo ran >> " + (dir / "runs").string() + "; exit 5", false, 2)});
  EXPECT_EQ(r.result.exit_code, 102);
  EXPECT_EQ(testing::read_file(dir / "runs"), "ran\n");
}

// A service that ends on its own the first time is restarted with its group (the worker,
// SIGKILLed and started again once the service is ready again); a worker outside the group
// runs on: one start only.
TEST(SupervisorRestart, AServicesGroupRestartsServiceFirstAndLeavesOthersAlone) {
  TempDir dir;
  const auto d = [&](const char* f) { return (dir / f).string(); };
  auto svc =
      sh("svc",
         "echo svc >> " + d("order") +
             "; echo 'listening on ipc://svc-ready'; "
             "if [ ! -f " +
             d("svc_died") + " ]; then touch " + d("svc_died") + "; until [ -f " + d("w_up") +
             " ]; do sleep 0.05; done; exit 9; fi; "
             "exec sleep 300",
         true, 0);
  svc.ready_endpoint = "ipc://svc-ready";
  svc.restart = on_failure(1);
  svc.restart_group = {"w"};
  // w: the first time it waits (to be SIGKILLed with the group), then finishes once other
  // has started.
  auto w = sh("w",
              "echo w >> " + d("order") + "; if [ ! -f " + d("w_up") + " ]; then touch " +
                  d("w_up") + "; exec sleep 300; fi; echo finished",
              false, 1);
  auto other =
      sh("other",
         "echo other >> " + d("others") + "; until [ -f " + d("svc_died") + " ] && [ $(wc -l < " +
             d("order") + ") -ge 4 ]; do sleep 0.05; done; echo done",
         false, 2);
  const auto r = run({svc, w, other});
  EXPECT_EQ(r.result.exit_code, 0) << r.result.message;
  EXPECT_EQ(testing::read_file(dir / "order"), "svc\nw\nsvc\nw\n");
  EXPECT_EQ(testing::read_file(dir / "others"), "other\n");
  EXPECT_THAT(r.lines, Contains("[w] finished"));
}

// The groups of a deployment (restart_group) under the Supervisor, with stand-ins for its
// roles that record their PIDs: a failed trainer restarts the trainers and the coordinator
// and leaves both services running (one PID each); then a failed service restarts itself,
// the trainers and the coordinator, and leaves the other service running.
TEST(SupervisorRestart, ATrainersFailureLeavesTheServicesAndAServicesTheOtherServices) {
  TempDir dir;
  write_file(dir / "ds.json", "{}");
  write_file(dir / "deploy.yaml", R"(
restart: on-failure
checkpoint: {dir: ckpt}
roles:
  - {role: offload, name: a}
  - {role: offload, name: b}
  - {role: coordinator}
  - {role: trainer, name: t0, config: ds.json, offload: [a]}
  - {role: trainer, name: t1, config: ds.json, offload: [b]}
)");
  const DeployConfig cfg = load_deploy_config(dir / "deploy.yaml");
  const auto d = [&](const std::string& f) { return (dir / f).string(); };
  // Each stand-in appends its PID to pids_<name>. t0 fails at its first start, once t1 has
  // written its PID: the file exists from the shell's open of it, and a kill between that open
  // and the write would leave t1 a line short and service a waiting for good. Service a ends
  // at its first start once both trainers run again (their second generation); t1 ends in its
  // third generation, t0 with it.
  const auto pid = [&](const std::string& name) {
    return "echo $$ >> " + d("pids_" + name) + "; ";
  };
  const auto lines = [&](const std::string& name) {
    return "$(wc -l < " + d("pids_" + name) + ")";
  };
  std::vector<ChildSpec> kids;
  for (const auto& spec : children_for(cfg, "dsactor", "token")) {
    ChildSpec c;
    const std::string& n = spec.name;
    if (n == "a")
      c = sh(n,
             pid(n) + "echo 'listening on ipc://a'; if [ " + lines(n) +
                 " -eq 1 ]; then until [ -f " + d("pids_t1") + " ] && [ " + lines("t1") +
                 " -ge 2 ] && [ " + lines("t0") + " -ge 2 ]; do sleep 0.05; done; exit 9; fi; " +
                 "exec sleep 300",
             true, 0);
    else if (n == "b" || n == "coordinator0")
      c = sh(n, pid(n) + "echo 'listening on ipc://" + n + "'; exec sleep 300", true, 1);
    else if (n == "t0")
      c = sh(n,
             pid(n) + "if [ " + lines(n) + " -eq 1 ]; then until [ -f " + d("pids_t1") +
                 " ] && [ " + lines("t1") + " -ge 1 ]; do sleep 0.05; done; exit 3; fi; " +
                 "until [ " + lines("t1") + " -ge 3 ]; do sleep 0.05; done; echo finished",
             false, 3);
    else
      c = sh(n, pid(n) + "if [ " + lines(n) + " -lt 3 ]; then exec sleep 300; fi; echo finished",
             false, 4);
    c.ready_endpoint = c.service ? "ipc://" + n : "";
    c.restart = on_failure(3);
    c.restart_group = spec.restart_group;
    kids.push_back(std::move(c));
  }
  const auto r = run(std::move(kids));
  EXPECT_EQ(r.result.exit_code, 0) << r.result.message;
  const auto count = [&](const std::string& name) {
    const std::string text = testing::read_file(dir / ("pids_" + name));
    return std::count(text.begin(), text.end(), '\n');
  };
  EXPECT_EQ(count("b"), 1) << "b was restarted";  // no failure of b's group
  EXPECT_EQ(count("a"), 2);                       // only its own failure
  EXPECT_EQ(count("coordinator0"), 3);
  EXPECT_EQ(count("t0"), 3);
  EXPECT_EQ(count("t1"), 3);
}

TEST(SupervisorRestart, ARestartGroupNamingNoChildIsRefused) {
  auto w = sh("w", "true");
  w.restart_group = {"nobody"};
  EXPECT_THROW(Supervisor({w}), std::invalid_argument);
}

}  // namespace
}  // namespace dsactor::deploy
