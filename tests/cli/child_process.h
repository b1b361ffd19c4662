#pragma once
// `dsactor` child processes (DSACTOR_BINARY) running in the background, output in files:
// for tests that run several processes at once, signal one, or watch `up` / `launch`.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "deploy/child_process.h"
#include "deploy/file_watch.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::testing {

// `dsactor <args>` running in the background, stdout and stderr in files (the same file
// when `out == err`); `extra_env` (NAME=VALUE) is added to this process's environment and
// `workdir`, when set, is its working directory. SIGKILLed by the destructor if still
// running (deploy::ChildProcess).
class DsactorProcess {
 public:
  DsactorProcess(std::vector<std::string> args, std::filesystem::path out,
                 std::filesystem::path err, const std::vector<std::string>& extra_env = {},
                 const std::filesystem::path& workdir = {})
      : out_(std::move(out)), err_(std::move(err)) {
    deploy::ChildOptions options;
    for (const auto& kv : extra_env) {
      const auto eq = kv.find('=');
      options.env.emplace_back(kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
    }
    options.workdir = workdir;
    options.out = deploy::Output::to_file(out_);
    options.err = err_ == out_ ? deploy::Output::same_as_stdout() : deploy::Output::to_file(err_);
    args.insert(args.begin(), DSACTOR_BINARY);
    process_ = deploy::ChildProcess::exec(args, options);
  }

  pid_t pid() const { return process_.pid(); }
  std::string out() const { return read_file(out_); }
  std::string err() const { return read_file(err_); }
  void signal(int sig) const { process_.signal(sig); }

  // The exit code (128 + signal when killed by one), or -1 when it did not end within
  // `timeout` (it is left running; the destructor kills it). Woken by the exit (pidfd).
  int wait(std::chrono::milliseconds timeout) {
    const auto status = process_.wait_for(timeout);
    return status ? deploy::exit_code(*status) : -1;
  }

  // True once stdout (stderr) contains `text`; false when the process exited without writing
  // it, or `timeout` passed. Woken by each write to the file (inotify) and by the exit.
  bool wait_for_out(const std::string& text, std::chrono::milliseconds timeout) {
    return wait_for_output(out_, text, timeout);
  }
  bool wait_for_err(const std::string& text, std::chrono::milliseconds timeout) {
    return wait_for_output(err_, text, timeout);
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
  bool wait_for_output(const std::filesystem::path& file, const std::string& text,
                       std::chrono::milliseconds timeout) {
    const auto has = [&](const std::string& t) { return t.find(text) != std::string::npos; };
    if (process_.try_wait()) return has(read_file(file));
    return deploy::wait_for_file(file, has, timeout, process_.pidfd());
  }

  std::filesystem::path out_, err_;
  deploy::ChildProcess process_;
};

// A trainer-side child for the multi-process tests: one compute thread, run in `workdir`,
// stdout and stderr together in `log`.
class Child : public DsactorProcess {
 public:
  Child(const std::filesystem::path& workdir, std::vector<std::string> args,
        const std::filesystem::path& log, std::vector<std::string> env = {})
      : DsactorProcess(with_one_thread(std::move(args)), log, log, env, workdir) {}
  std::string log() const { return out(); }

 private:
  static std::vector<std::string> with_one_thread(std::vector<std::string> args) {
    args.insert(args.begin(), {"--threads", "1"});
    return args;
  }
};

}  // namespace dsactor::testing
