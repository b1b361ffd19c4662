#pragma once
// One offload service as a child process: `<binary> start --role offload --listen
// tcp://127.0.0.1:* <args>`, stdout discarded, stderr (its log) in a file. Used by the
// benchmarks and the tests that need a real service next to them; `dsactor up` has its own
// supervisor for whole deployments.
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "deploy/child_process.h"

namespace dsactor::deploy {

class ServiceProcess {
 public:
  // Returns once the log names the endpoint the service listens on (woken by each write to
  // the log, and by the service's exit); throws with the log when the service exits first or
  // stays silent past `startup_timeout`. The service runs with OMP_WAIT_POLICY=passive unless
  // the environment sets it (as `dsactor up` does): an idle service must not spin on the
  // cores of the trainer beside it.
  ServiceProcess(const std::string& binary, const std::vector<std::string>& args,
                 std::filesystem::path log_file,
                 std::chrono::milliseconds startup_timeout = std::chrono::seconds(30));
  ServiceProcess(const ServiceProcess&) = delete;
  ServiceProcess& operator=(const ServiceProcess&) = delete;
  // The destructor SIGKILLs a service still running (ChildProcess).

  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return process_.pid(); }
  std::string log() const;
  // SIGTERM, then the exit status (128 + signal when killed by one), or -1 when it did not
  // exit within `timeout` (it is left running; the destructor kills it) or was stopped before.
  int stop(std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  std::filesystem::path log_file_;
  ChildProcess process_;
  std::string endpoint_;
};

}  // namespace dsactor::deploy
