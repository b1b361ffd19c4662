#pragma once
// Runs the roles of a deployment as child processes on this machine (`dsactor up`).
//
// Order: services (offload, coordinator) are spawned first and must become ready within
// their startup_timeout; then workers (trainers) are spawned. The run succeeds when every
// worker exits 0 (the services are then stopped). It fails, stopping everything, when a
// service exits, a worker exits non-zero or dies of a signal, or a service never becomes
// ready; unless the child that failed has a restart policy with restarts left: then its
// restart group is stopped (workers with SIGKILL: their durable state is the last
// checkpoint; services with SIGTERM), and after the policy's backoff started again as at
// the start, services first (torchelastic's group restart). A stop request (SIGINT/SIGTERM through
// `stop_signals`, or request_stop()) stops everything too. Stopping: workers first, then services;
// each gets SIGTERM, then SIGKILL after its shutdown_timeout.
//
// No orphans: each child leads its own process group (signals go to the whole group, so a
// child's own children are stopped with it, and the terminal's Ctrl-C reaches only the
// supervisor, which then stops the roles in order), and has PR_SET_PDEATHSIG(SIGKILL) so it
// dies with the supervisor even when the supervisor is SIGKILLed.
#include <signal.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "deploy/child_process.h"  // shell_quote
#include "deploy/deploy_config.h"

namespace dsactor::deploy {

// What run() does when a child fails.
struct RestartPolicy {
  bool on_failure = false;  // false: the failure ends the run
  int max_restarts = 0;     // restarts after failures of this child; one more ends the run
  std::chrono::milliseconds backoff{1000};
  std::chrono::milliseconds backoff_max{30000};
  // The wait before restart n (from 1): backoff * 2^(n-1), at most backoff_max.
  std::chrono::milliseconds delay(int n) const;
};

struct ChildSpec {
  std::string name;               // log prefix "[name] " and the name in every message
  std::vector<std::string> argv;  // argv[0]: a path, or a name looked up in PATH
  std::vector<std::pair<std::string, std::string>> env;  // added to the inherited environment
  std::optional<std::string> stdin_text;  // the child's stdin (ChildOptions); else /dev/null
  // Services must become ready before any worker starts, and must not exit on their own.
  bool service = false;
  // Services: ready when a line of output contains "listening on <ready_endpoint>" or a
  // connection to it (tcp:// or ipc://) succeeds. Empty: ready as soon as it is spawned.
  std::string ready_endpoint;
  // Services: when set, a connection to ready_endpoint counts as ready only once this also
  // returns true (a round trip of the service's own protocol, e.g. the coordinator's
  // rendezvous store answering a request). Called on run()'s thread; keep it short.
  std::function<bool()> ready_probe;
  std::chrono::milliseconds startup_timeout{static_cast<int64_t>(kDefaultStartupSeconds * 1000)};
  std::chrono::milliseconds shutdown_timeout{static_cast<int64_t>(kDefaultShutdownSeconds * 1000)};
  // Reported in the exit code (100 + code_index) when this child is the one that failed.
  int code_index = 0;
  RestartPolicy restart;
  // The other children (by name) stopped and started again with this one when it fails and
  // is restarted. A name that is no child is a std::invalid_argument of the constructor.
  std::vector<std::string> restart_group;
  // The argv of a restart, asked at each one (a trainer's depends on the checkpoints there
  // are by then); unset: argv.
  std::function<std::vector<std::string>()> restart_argv;
};

struct SupervisorOptions {
  // Receives every output line of every child, already prefixed ("[offload0] ..."), and
  // nothing else. Default: written to stdout. Called on the thread that runs run().
  std::function<void(std::string_view line)> sink;
  // Signals that mean "stop everything" (SIGINT, SIGTERM): run() installs a handler for them
  // (restoring the previous one when it returns); one ignored at that moment stays ignored
  // (nohup). At most one run() at a time may handle signals. Empty: only request_stop().
  std::vector<int> stop_signals;
  size_t tail_lines = 20;  // stderr lines kept per child for the failure message
  std::chrono::milliseconds probe_interval{100};  // between readiness connection attempts
};

struct SupervisorResult {
  // 0: there were workers and every one exited 0.
  // 100 + code_index (at most 199): that child failed (exit code, signal, never ready, or a
  //   service that ended on its own).
  // 128 + signal: stopped by a stop signal (130 for SIGINT); 143 for request_stop(), as if
  //   SIGTERM. A deployment of services only runs until one of these.
  int exit_code = 0;
  std::string failed;   // name of the child that failed; empty when none did
  std::string message;  // what happened, with the failed child's last stderr lines
};

class Supervisor {
 public:
  Supervisor(std::vector<ChildSpec> children, SupervisorOptions options = {});
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Runs the deployment to its end; returns only when no child is left. Call once.
  SupervisorResult run();
  // Thread- and async-signal-safe: makes run() stop everything and return.
  void request_stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The children `dsactor up` runs for a deployment: `binary` + to_command_line(role) for each
// role, with DSACTOR_JOB and DSACTOR_ROLE_NAME in their environment, and the run's
// `job_token` in DSACTOR_JOB_TOKEN for the trainers and the coordinator (unless the file
// names a job_token_file, which their command lines carry). A coordinator is ready once its
// rendezvous store answers a request made with its own key and the token (ready_probe), not
// merely accepts connections. Each child's restart policy is its role's, its restart group
// restart_group(config, role); a restarted trainer gets `--resume <checkpoint dir>` when
// that directory holds a `latest` checkpoint, else `--overwrite` (it starts over, dropping
// what the services hold of its job). Same keys and token on every restart.
std::vector<ChildSpec> children_for(const DeployConfig& config, const std::string& binary,
                                    const std::string& job_token);

}  // namespace dsactor::deploy
