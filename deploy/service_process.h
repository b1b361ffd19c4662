#pragma once
// One offload service as a child process: `<binary> start --role offload --listen
// tcp://127.0.0.1:* <args>` (the args' own --listen instead, if they have one), stdout discarded,
// stderr (its log) in a file. Used by the benchmarks and the tests that need a real service next to
// them; `dsactor up` has its own supervisor for whole deployments.
//
// Authenticated unless the args say --insecure: the service gets a keypair and admits one
// client key, both made here (or found in ServiceProcessOptions::keys_dir), and
// client_security() is what a client of it connects with. Without --state-dir or --nvme in
// the args the service keeps its state in a directory of its own here (never the user's
// state home).
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "deploy/child_process.h"
#include "security/transport_security.h"

namespace dsactor::deploy {

struct ServiceProcessOptions {
  std::vector<std::string> args;  // after `start --role offload --listen tcp://127.0.0.1:*`
  std::filesystem::path log_file;
  std::chrono::milliseconds startup_timeout = std::chrono::seconds(30);
  // Where the keys are: `service.key_secret` (the service's) and `client.key_secret` (the
  // one client key it admits), made when missing and kept, so services started one after
  // the other can share them (a client and its checkpoints outlive one service). Empty: a
  // fresh directory, removed with this object.
  std::filesystem::path keys_dir;
  // Public keys the service admits besides the client's (other clients of a test).
  std::vector<std::string> extra_client_keys;
  // Added to the inherited environment (a test seam such as DSACTOR_TEST_CRASH_AT).
  std::vector<std::pair<std::string, std::string>> env;
};

class ServiceProcess {
 public:
  // Returns once the log names the endpoint the service listens on (woken by each write to
  // the log, and by the service's exit); throws with the log when the service exits first or
  // stays silent past `startup_timeout`. The service runs with OMP_WAIT_POLICY=passive unless
  // the environment sets it (as `dsactor up` does): an idle service must not spin on the
  // cores of the trainer beside it.
  ServiceProcess(const std::string& binary, ServiceProcessOptions options);
  ServiceProcess(const std::string& binary, const std::vector<std::string>& args,
                 std::filesystem::path log_file,
                 std::chrono::milliseconds startup_timeout = std::chrono::seconds(30));
  ServiceProcess(const ServiceProcess&) = delete;
  ServiceProcess& operator=(const ServiceProcess&) = delete;
  // The destructor SIGKILLs a service still running (ChildProcess) and removes a keys
  // directory it made.
  ~ServiceProcess();

  const std::string& endpoint() const { return endpoint_; }
  // How a client connects: the client keypair and the service's public key (insecure when
  // the service runs --insecure).
  const security::ClientSecurity& client_security() const { return client_; }
  // What `dsactor start --role trainer` needs to use this service (and no other): the
  // client keypair and the service's public key, or --insecure.
  std::vector<std::string> trainer_flags() const;
  // The keys directory (empty when insecure).
  const std::filesystem::path& keys_dir() const { return keys_dir_; }
  pid_t pid() const { return process_.pid(); }
  std::string log() const;
  // SIGTERM, then the exit status (128 + signal when killed by one), or -1 when it did not
  // exit within `timeout` (it is left running; the destructor kills it) or was stopped before.
  int stop(std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  // Makes (or finds) the keys and returns the flags that give them to the service.
  std::vector<std::string> keys_flags(const ServiceProcessOptions& options);

  std::filesystem::path log_file_;
  std::filesystem::path keys_dir_;
  bool own_keys_dir_ = false;
  security::ClientSecurity client_{true, {}, {}};
  ChildProcess process_;
  std::string endpoint_;
};

}  // namespace dsactor::deploy
