#pragma once
// A `dsactor` child process (DSACTOR_BINARY, one thread) running in the background, with
// stdout and stderr in a log file: for tests that run several processes at once or signal
// one.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/deploy/deploy_test_util.h"

extern char** environ;

namespace dsactor::testing {

// A dsactor child with stdout and stderr in a log file.
class Child {
 public:
  // `env`: NAME=VALUE entries added to this process's environment.
  Child(const std::filesystem::path& workdir, const std::vector<std::string>& args,
        std::filesystem::path log, std::vector<std::string> env = {})
      : log_(std::move(log)) {
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    std::vector<char*> cenv;
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    std::vector<std::string> argv = {DSACTOR_BINARY, "--threads", "1"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& s : argv) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addchdir_np(&fa, workdir.c_str());
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pid_, argv[0].c_str(), &fa, nullptr, cargv.data(), cenv.data()) != 0)
      pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Exit code, or -1 if it did not end within `timeout` (then it is killed).
  int wait(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
  std::string log() const { return read_file(log_); }
  pid_t pid() const { return pid_; }
  void signal(int sig) const {
    if (pid_ > 0) ::kill(pid_, sig);
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

}  // namespace dsactor::testing
