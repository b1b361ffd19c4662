#pragma once
// `dsactor` child processes (DSACTOR_BINARY) running in the background, output in files:
// for tests that run several processes at once, signal one, or watch `up` / `launch`.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/deploy/deploy_test_util.h"

extern char** environ;

namespace dsactor::testing {

// `dsactor <args>` running in the background, stdout and stderr in files (the same file
// when `out == err`); `extra_env` (NAME=VALUE) is added to this process's environment and
// `workdir`, when set, is its working directory. SIGKILLed by the destructor if still
// running.
class DsactorProcess {
 public:
  DsactorProcess(std::vector<std::string> args, std::filesystem::path out,
                 std::filesystem::path err, std::vector<std::string> extra_env = {},
                 const std::filesystem::path& workdir = {})
      : out_(std::move(out)), err_(std::move(err)) {
    for (char** e = environ; *e; ++e) extra_env.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : extra_env) envp.push_back(e.data());
    envp.push_back(nullptr);
    args.insert(args.begin(), DSACTOR_BINARY);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (!workdir.empty()) posix_spawn_file_actions_addchdir_np(&fa, workdir.c_str());
    posix_spawn_file_actions_addopen(&fa, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err_ == out_)
      posix_spawn_file_actions_adddup2(&fa, 1, 2);
    else
      posix_spawn_file_actions_addopen(&fa, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (posix_spawn(&pid_, DSACTOR_BINARY, &fa, nullptr, argv.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~DsactorProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  DsactorProcess(const DsactorProcess&) = delete;
  DsactorProcess& operator=(const DsactorProcess&) = delete;

  pid_t pid() const { return pid_; }
  std::string out() const { return read_file(out_); }
  std::string err() const { return read_file(err_); }
  void signal(int sig) const {
    if (pid_ > 0 && !exited_) ::kill(pid_, sig);
  }

  // The exit code (128 + signal when killed by one), or -1 when it did not end within
  // `timeout` (it is left running; the destructor kills it).
  int wait(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

  // The pids `dsactor up` / `launch` logged as "started NAME (pid N)".
  std::vector<pid_t> children() const {
    std::vector<pid_t> pids;
    const std::string e = err();
    static const std::regex re(R"(started \S+ \(pid (\d+)\))");
    for (auto it = std::sregex_iterator(e.begin(), e.end(), re); it != std::sregex_iterator(); ++it)
      pids.push_back(static_cast<pid_t>(std::stol((*it)[1])));
    return pids;
  }

 private:
  std::filesystem::path out_, err_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

// A trainer-side child for the multi-process tests: one compute thread, run in `workdir`,
// stdout and stderr together in `log`.
class Child : public DsactorProcess {
 public:
  Child(const std::filesystem::path& workdir, std::vector<std::string> args,
        const std::filesystem::path& log, std::vector<std::string> env = {})
      : DsactorProcess(with_one_thread(std::move(args)), log, log, std::move(env), workdir) {}
  std::string log() const { return out(); }

 private:
  static std::vector<std::string> with_one_thread(std::vector<std::string> args) {
    args.insert(args.begin(), {"--threads", "1"});
    return args;
  }
};

}  // namespace dsactor::testing
