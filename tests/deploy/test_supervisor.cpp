// Supervisor mechanics with real child processes (small shell scripts): log prefixing,
// readiness (log line, connection, timeout), failure propagation, shutdown escalation,
// stop signals, and no process left behind on any path. The tests wait on events (a pid
// file written, a FIFO opened, a process gone) and check what happened in which order (a
// child's trap line for the SIGTERM it got, the supervisor's SIGKILL warning); no duration
// is asserted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "deploy/run_keys.h"
#include "deploy/supervisor.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::deploy {
namespace {

using dsactor::testing::pid_from;
using dsactor::testing::TempDir;
using dsactor::testing::wait_for_pid;
using dsactor::testing::wait_gone;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

ChildSpec sh(const std::string& name, const std::string& script, bool service = false,
             int index = 0) {
  ChildSpec c;
  c.name = name;
  c.argv = {"sh", "-c", script};
  c.service = service;
  c.code_index = index;
  c.startup_timeout = 5s;
  c.shutdown_timeout = 2s;
  return c;
}

// A service that writes its pid to `pidfile`, then announces itself ready, then waits: the
// workers start only once its pid is on disk.
ChildSpec service_with_pid(const std::string& name, const std::filesystem::path& pidfile,
                           int index) {
  auto c = sh(name,
              "echo $$ > " + pidfile.string() + "; echo \"listening on ipc://" + name +
                  "-ready\"; exec sleep 30",
              true, index);
  c.ready_endpoint = "ipc://" + name + "-ready";
  return c;
}

// A FIFO for two children to meet at: `arrive(f)` in one blocks until the other reaches
// `await(f)` (opening a FIFO waits for its other end), then both go on.
std::filesystem::path make_fifo(const std::filesystem::path& path) {
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  return path;
}
std::string arrive(const std::filesystem::path& fifo) {
  return "echo > " + fifo.string() + "; ";
}
std::string await(const std::filesystem::path& fifo) {
  return "read _ < " + fifo.string() + "; ";
}

// Shell code that idles until SIGTERM, then says so and exits 0: its line in the output shows
// the supervisor stopped it (rather than waiting for it to end).
// `ready` (a pid file written, a fifo arrived at) runs once the trap is set: run before it,
// a SIGTERM sent as soon as the test sees it ready could kill the shell unreported.
std::string idle_until_sigterm(const std::string& name, const std::string& ready = "") {
  return "trap 'echo " + name + " stopped by SIGTERM; exit 0' TERM; " + ready +
         "sleep 300 & wait; ";
}

// The supervisor's own log (spdlog's default logger) while it lives: where it says it sent
// SIGKILL.
class SupervisorLog {
 public:
  SupervisorLog() : old_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~SupervisorLog() { spdlog::set_default_logger(old_); }
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::logger> old_;
};

struct Run {
  SupervisorResult result;
  std::vector<std::string> lines;
};

// Runs the children to the end; `during` (if any) runs on another thread meanwhile.
Run run(std::vector<ChildSpec> children, const std::function<void(Supervisor&)>& during = {},
        SupervisorOptions opt = {}) {
  Run r;
  opt.sink = [&r](std::string_view l) { r.lines.emplace_back(l); };
  opt.probe_interval = 20ms;
  Supervisor sup(std::move(children), opt);
  std::thread side;
  if (during) side = std::thread([&] { during(sup); });
  r.result = sup.run();
  if (side.joinable()) side.join();
  return r;
}

// Every pid a child wrote must be gone (a reparented one is gone once it exited, before init
// reaps it).
void expect_gone(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    EXPECT_GT(p, 0) << "a child never wrote its pid";
    EXPECT_TRUE(wait_gone(p, 30s)) << "pid " << p << " survived";
  }
}

TEST(Supervisor, PrefixesEveryLineOfStdoutAndStderr) {
  const auto r = run({sh("w", "echo hello; echo oops >&2; printf 'no newline'")});
  EXPECT_EQ(r.result.exit_code, 0) << r.result.message;
  EXPECT_TRUE(r.result.failed.empty());
  EXPECT_THAT(r.lines, Contains("[w] hello"));
  EXPECT_THAT(r.lines, Contains("[w] oops"));
  EXPECT_THAT(r.lines, Contains("[w] no newline"));
}

TEST(Supervisor, WorkersStartAfterServicesAnnounceTheirEndpointAndServicesStopAfterwards) {
  TempDir dir;
  const int port =
      dsactor::testing::free_port();  // nobody listens: only the log line can say ready
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  // The `sleep 0.3` is a delay, not a synchronization: a supervisor that started the worker
  // before the line would let it look for "ready" during it.
  auto svc = sh("svc",
                "echo $$ > " + (dir / "svc.pid").string() + "; sleep 0.3; touch " +
                    (dir / "ready").string() + "; echo \"svc listening on " + ep +
                    " (RAM tier)\"; " + idle_until_sigterm("svc"),
                true, 0);
  svc.ready_endpoint = ep;
  const auto r =
      run({svc, sh("w", "test -f " + (dir / "ready").string() + " && echo saw-ready", false, 1)});
  EXPECT_EQ(r.result.exit_code, 0) << r.result.message;
  EXPECT_THAT(r.lines, Contains("[w] saw-ready"));
  EXPECT_THAT(r.lines, Contains("[svc] svc stopped by SIGTERM"));  // not waited for
  expect_gone({pid_from(dir / "svc.pid")});
}

int listening_socket(int port = 0) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(s, 8) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

TEST(Supervisor, ServiceIsReadyWhenItsEndpointAcceptsConnections) {
  // The test plays the service's socket, opened once the child runs; the child prints nothing.
  TempDir dir;
  const int port = dsactor::testing::free_port();
  auto svc = sh("svc", "echo $$ > " + (dir / "svc.pid").string() + "; exec sleep 30", true, 0);
  svc.ready_endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  int s = -1;
  svc.startup_timeout = 60s;
  const auto r = run({svc, sh("w", "echo ran", false, 1)}, [&](Supervisor&) {
    wait_for_pid(dir / "svc.pid", 60s);
    s = listening_socket(port);
  });
  ASSERT_GE(s, 0);
  ::close(s);
  EXPECT_EQ(r.result.exit_code, 0) << r.result.message;
  EXPECT_THAT(r.lines, Contains("[w] ran"));
  expect_gone({pid_from(dir / "svc.pid")});
}

TEST(Supervisor, EndpointTakenBeforeTheServiceStartsIsAFailure) {
  const int s = listening_socket();
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  auto svc = sh("svc", "exec sleep 30", true, 3);
  svc.ready_endpoint = "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  const auto r = run({svc});
  ::close(s);
  EXPECT_EQ(r.result.exit_code, 103);
  EXPECT_EQ(r.result.failed, "svc");
  EXPECT_THAT(r.result.message, AllOf(HasSubstr("its endpoint " + svc.ready_endpoint +
                                                " is taken by another process"),
                                      HasSubstr("already accepts connections before svc started")));
}

TEST(Supervisor, ServiceThatNeverAnswersStopsEverythingAtItsStartupTimeout) {
  TempDir dir;
  auto fast = service_with_pid("fast", dir / "fast.pid", 0);
  auto slow =
      sh("slow", "echo $$ > " + (dir / "slow.pid").string() + "; echo booting; exec sleep 30", true,
         1);
  slow.ready_endpoint = "tcp://127.0.0.1:" + std::to_string(dsactor::testing::free_port());
  slow.startup_timeout = 500ms;
  const auto r = run({fast, slow, sh("w", "touch " + (dir / "worker_ran").string(), false, 2)});
  EXPECT_EQ(r.result.exit_code, 101);
  EXPECT_EQ(r.result.failed, "slow");
  EXPECT_THAT(r.result.message, AllOf(HasSubstr("role \"slow\" never became ready"),
                                      HasSubstr(slow.ready_endpoint), HasSubstr("0.5 s")));
  EXPECT_FALSE(std::filesystem::exists(dir / "worker_ran"));
  EXPECT_THAT(r.lines, Contains("[slow] booting"));
  expect_gone({pid_from(dir / "fast.pid"), pid_from(dir / "slow.pid")});
}

TEST(Supervisor, FailingRoleStopsTheOthersAndIsNamedWithItsExitCodeAndStderr) {
  TempDir dir;
  const auto long_runs = make_fifo(dir / "long_runs");
  const auto r = run({
      service_with_pid("svc", dir / "svc.pid", 0),
      sh("long",
         idle_until_sigterm("long",
                            "echo $$ > " + (dir / "long.pid").string() + "; " + arrive(long_runs)),
         false, 1),
      sh("bad", await(long_runs) + "echo 'step 3: loss is nan' >&2; echo bye; exit 3", false, 2),
  });
  EXPECT_EQ(r.result.exit_code, 102);
  EXPECT_EQ(r.result.failed, "bad");
  EXPECT_THAT(r.result.message, AllOf(HasSubstr("role \"bad\" exited with code 3"),
                                      HasSubstr("step 3: loss is nan"), Not(HasSubstr("bye"))));
  EXPECT_THAT(r.lines, Contains("[long] long stopped by SIGTERM"));
  expect_gone({pid_from(dir / "svc.pid"), pid_from(dir / "long.pid")});
}

TEST(Supervisor, WorkerKilledBySignalIsAFailure) {
  const auto r = run({sh("w", "kill -9 $$", false, 4)});
  EXPECT_EQ(r.result.exit_code, 104);
  EXPECT_THAT(r.result.message, HasSubstr("was killed by signal 9 (SIGKILL)"));
}

TEST(Supervisor, ServiceThatExitsWhileTrainersRunIsAFailure) {
  TempDir dir;
  const auto w_runs = make_fifo(dir / "w_runs");
  const auto r = run({
      sh("svc", await(w_runs) + "echo 'out of memory' >&2; exit 0", true, 0),
      sh("w", "echo $$ > " + (dir / "w.pid").string() + "; " + arrive(w_runs) + "exec sleep 300",
         false, 1),
  });
  EXPECT_EQ(r.result.exit_code, 100);
  EXPECT_EQ(r.result.failed, "svc");
  EXPECT_THAT(r.result.message,
              AllOf(HasSubstr("exited with code 0 while the deployment was running"),
                    HasSubstr("out of memory")));
  expect_gone({pid_from(dir / "w.pid")});
}

TEST(Supervisor, CommandThatCannotStartIsNamed) {
  TempDir dir;
  ChildSpec missing;
  missing.name = "ghost";
  missing.argv = {(dir / "no-such-binary").string()};
  missing.code_index = 1;
  ChildSpec not_in_path = missing;
  not_in_path.argv = {"dsactor-no-such-command-anywhere"};
  for (const auto& c : {missing, not_in_path}) {
    const auto r = run({service_with_pid("svc", dir / "svc.pid", 0), c});
    EXPECT_EQ(r.result.exit_code, 101);
    EXPECT_EQ(r.result.failed, "ghost");
    EXPECT_THAT(r.result.message,
                AllOf(HasSubstr("exited with code 127"), HasSubstr("cannot start")));
    expect_gone({pid_from(dir / "svc.pid")});
  }
}

TEST(Supervisor, StopRequestEndsGracefulChildrenWithSigterm) {
  TempDir dir;
  const auto pidfile = dir / "w.pid";
  SupervisorLog log;
  const auto r =
      run({sh("svc", idle_until_sigterm("svc"), true, 0),
           sh("w", idle_until_sigterm("w", "echo $$ > " + pidfile.string() + "; "), false, 1)},
          [&](Supervisor& s) {
            wait_for_pid(pidfile, 60s);
            s.request_stop();
          });
  EXPECT_EQ(r.result.exit_code, 128 + SIGTERM);
  EXPECT_TRUE(r.result.failed.empty());
  EXPECT_THAT(r.lines, Contains("[w] w stopped by SIGTERM"));
  EXPECT_THAT(r.lines, Contains("[svc] svc stopped by SIGTERM"));
  EXPECT_THAT(log.text(), Not(HasSubstr("SIGKILL")));  // nobody needed it
  expect_gone({pid_from(pidfile)});
}

TEST(Supervisor, ChildIgnoringSigtermIsKilledAfterItsShutdownTimeout) {
  TempDir dir;
  const auto pidfile = dir / "w.pid";
  const auto bgfile = dir / "bg.pid";
  // The background job ignores SIGTERM (started while the shell ignored it: inherited); the
  // shell itself says it got one and goes on.
  auto w = sh("stubborn", "trap '' TERM; sleep 300 & echo $! > " + bgfile.string() +
                              "; trap 'echo stubborn ignores SIGTERM' TERM; echo $$ > " +
                              pidfile.string() + "; while :; do sleep 300 & wait; done");
  w.shutdown_timeout = 400ms;
  SupervisorLog log;
  const auto r = run({w}, [&](Supervisor& s) {
    wait_for_pid(bgfile, 60s);
    wait_for_pid(pidfile, 60s);
    s.request_stop();
  });
  EXPECT_EQ(r.result.exit_code, 128 + SIGTERM);
  // SIGTERM first (the shell's line), SIGKILL after the shutdown timeout (the warning).
  EXPECT_THAT(r.lines, Contains("[stubborn] stubborn ignores SIGTERM"));
  EXPECT_THAT(log.text(),
              HasSubstr("stubborn did not stop within 0.4 s of SIGTERM: sending SIGKILL"));
  expect_gone({pid_from(pidfile), pid_from(bgfile)});
}

TEST(Supervisor, BackgroundJobsOfAChildDieWithIt) {
  TempDir dir;
  // The job holds the child's stdout open; had the run waited for it to close, the job would
  // have lived to write `ended`.
  const auto r = run({sh("w", "(sleep 30; touch " + (dir / "ended").string() + ") & echo $! > " +
                                  (dir / "bg.pid").string() + "; echo done")});
  EXPECT_EQ(r.result.exit_code, 0) << r.result.message;
  expect_gone({pid_from(dir / "bg.pid")});
  EXPECT_FALSE(std::filesystem::exists(dir / "ended"));
}

TEST(Supervisor, StopSignalToTheProcessStopsTheRunAndTheOldHandlerComesBack) {
  // SIGTERM rather than SIGINT: a shell's background job (`ctest &`) starts with SIGINT
  // ignored, and an ignored signal is left ignored on purpose.
  TempDir dir;
  const auto pidfile = dir / "svc.pid";
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);
  SupervisorOptions opt;
  opt.stop_signals = {SIGINT, SIGTERM};
  const auto r = run(
      {sh("svc", "echo $$ > " + pidfile.string() + "; exec sleep 30", true, 0)},
      [&](Supervisor&) {
        wait_for_pid(pidfile, 60s);
        ::kill(::getpid(), SIGTERM);
      },
      opt);
  EXPECT_EQ(r.result.exit_code, 128 + SIGTERM);
  expect_gone({pid_from(pidfile)});
  struct sigaction after {};
  ::sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

TEST(Supervisor, IgnoredStopSignalStaysIgnored) {
  struct sigaction ign {
  }, old{};
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGHUP, &ign, &old);
  TempDir dir;
  const auto pidfile = dir / "w.pid";
  const auto go = make_fifo(dir / "go");
  SupervisorOptions opt;
  opt.stop_signals = {SIGHUP};
  const auto r = run(
      {sh("w", "echo $$ > " + pidfile.string() + "; " + await(go) + "echo finished")},
      [&](Supervisor&) {
        wait_for_pid(pidfile, 60s);
        ::kill(::getpid(), SIGHUP);  // as under nohup: no effect
        std::ofstream(go) << "\n";   // the child runs on only now, after the signal
      },
      opt);
  ::sigaction(SIGHUP, &old, nullptr);
  EXPECT_EQ(r.result.exit_code, 0) << r.result.message;
  EXPECT_THAT(r.lines, Contains("[w] finished"));
}

TEST(Supervisor, EnvironmentReachesTheChild) {
  auto w = sh("w", "echo \"job=$DSACTOR_TEST_JOB path_set=${PATH:+yes}\"");
  w.env = {{"DSACTOR_TEST_JOB", "j1"}};
  const auto r = run({w});
  EXPECT_THAT(r.lines, Contains("[w] job=j1 path_set=yes"));
}

TEST(Supervisor, RealOffloadServiceThenAShellTrainerThenACleanStop) {
  // The offload role runs exactly as `dsactor up` starts it (children_for); the trainer is a
  // shell stand-in, started only once the service said it listens.
  TempDir dir;
  const int port = dsactor::testing::free_port();
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  dsactor::testing::write_file(dir / "ds.json", "{}");
  dsactor::testing::write_file(
      dir / "d.yaml", "security: {keys_dir: keys}\nroles:\n  - {role: offload, listen: \"" + ep +
                          "\", mlock: false, memory_limit: 64MiB}\n");
  const auto cfg = load_deploy_config(dir / "d.yaml");
  make_run_keys(cfg);  // as `dsactor up` does before it starts anything
  auto kids = children_for(cfg, DSACTOR_BINARY, run_job_token(cfg));
  ASSERT_EQ(kids.size(), 1u);
  kids[0].startup_timeout = 20s;
  auto trainer = sh("trainer0", "echo trainer sees the service; exit 0", false, 1);
  const auto r = run({kids[0], trainer});
  EXPECT_EQ(r.result.exit_code, 0) << r.result.message;
  EXPECT_THAT(r.lines, Contains(HasSubstr("[offload0] ")));
  EXPECT_THAT(r.lines, Contains(AllOf(HasSubstr("[offload0] "), HasSubstr("listening on " + ep))));
  EXPECT_THAT(r.lines, Contains("[trainer0] trainer sees the service"));
  // Stopped by SIGTERM, cleanly: its own shutdown log line, no SIGKILL needed.
  EXPECT_THAT(r.lines,
              Contains(AllOf(HasSubstr("[offload0] "), HasSubstr("offload service stopped"))));
}

TEST(Supervisor, ChildrenForADeployment) {
  TempDir dir;
  dsactor::testing::write_file(dir / "ds.json", "{}");
  dsactor::testing::write_file(dir / "d.yaml", R"(
job: j
shutdown_timeout: 3
roles:
  - {role: offload, listen: "tcp://127.0.0.1:7100", env: {X: "1"}}
  - {role: trainer, config: ds.json, startup_timeout: 7}
)");
  const auto cfg = load_deploy_config(dir / "d.yaml");
  const auto kids = children_for(cfg, "/bin/dsactor", "token-of-the-run-0123456789");
  ASSERT_EQ(kids.size(), 2u);
  EXPECT_EQ(kids[0].argv.front(), "/bin/dsactor");
  EXPECT_EQ(kids[0].argv[1], "start");
  EXPECT_TRUE(kids[0].service);
  EXPECT_EQ(kids[0].ready_endpoint, "tcp://127.0.0.1:7100");
  EXPECT_EQ(kids[0].shutdown_timeout, 3s);
  EXPECT_FALSE(kids[1].service);
  EXPECT_EQ(kids[1].startup_timeout, 7s);
  EXPECT_EQ(kids[1].code_index, 1);
  using Env = std::pair<std::string, std::string>;
  EXPECT_THAT(kids[0].env, Contains(Env{"DSACTOR_JOB", "j"}));
  EXPECT_THAT(kids[0].env, Contains(Env{"DSACTOR_ROLE_NAME", "offload0"}));
  EXPECT_THAT(kids[0].env, Contains(Env{"X", "1"}));
  // Services sleep between requests instead of spinning on the trainers' cores.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    EXPECT_THAT(kids[0].env, Contains(Env{"OMP_WAIT_POLICY", "passive"}));
    EXPECT_THAT(kids[1].env, Not(Contains(Env{"OMP_WAIT_POLICY", "passive"})));
  }
  EXPECT_EQ(shell_quote({"a", "b c", "it's"}), "a 'b c' 'it'\\''s'");
}

// The run's token reaches the trainers and the coordinator in their environment, never in an
// argv (which every user of the machine can read), unless the file names a token file.
TEST(Supervisor, TheRunsTokenTravelsInTheEnvironment) {
  TempDir dir;
  dsactor::testing::write_file(dir / "ds.json", "{}");
  const std::string roles = R"(
roles:
  - {role: coordinator}
  - {role: offload}
  - {role: trainer, config: ds.json}
  - {role: trainer, config: ds.json}
)";
  dsactor::testing::write_file(dir / "d.yaml", roles);
  const std::string token = "token-of-the-run-0123456789";
  const auto kids = children_for(load_deploy_config(dir / "d.yaml"), "/bin/dsactor", token);
  using Env = std::pair<std::string, std::string>;
  for (const auto& k : kids) {
    EXPECT_THAT(k.argv, Not(Contains(HasSubstr(token)))) << k.name;
    if (k.name == "offload0") {
      EXPECT_THAT(k.env, Not(Contains(Env{"DSACTOR_JOB_TOKEN", token})));
    } else {
      EXPECT_THAT(k.env, Contains(Env{"DSACTOR_JOB_TOKEN", token})) << k.name;
    }
  }
  dsactor::testing::write_file(dir / "f.yaml", "security: {job_token_file: t}" + roles);
  for (const auto& k : children_for(load_deploy_config(dir / "f.yaml"), "/bin/dsactor", token)) {
    EXPECT_THAT(k.env, Not(Contains(Env{"DSACTOR_JOB_TOKEN", token}))) << k.name;
    if (k.name != "offload0") {
      EXPECT_THAT(k.argv, Contains((dir / "t").string())) << k.name;
    }
  }
}

}  // namespace
}  // namespace dsactor::deploy
