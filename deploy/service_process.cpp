#include "deploy/service_process.h"

#include <signal.h>

#include <cstdlib>
#include <regex>
#include <stdexcept>

#include "deploy/file_watch.h"

namespace dsactor::deploy {

ServiceProcess::ServiceProcess(const std::string& binary, const std::vector<std::string>& args,
                               std::filesystem::path log_file,
                               std::chrono::milliseconds startup_timeout)
    : log_file_(std::move(log_file)) {
  std::vector<std::string> argv{binary,    "start",    "--role",
                                "offload", "--listen", "tcp://127.0.0.1:*"};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildOptions options;
  options.out = Output::null();
  options.err = Output::to_file(log_file_);
  if (!std::getenv("OMP_WAIT_POLICY")) options.env.emplace_back("OMP_WAIT_POLICY", "passive");
  try {
    process_ = ChildProcess::exec(argv, options);
  } catch (const ChildStartError& e) {
    throw std::runtime_error(std::string("offload service: ") + e.what());
  }

  const std::regex re("listening on (tcp://[0-9.]+:[0-9]+)");
  const bool listening = wait_for_file(
      log_file_,
      [&](const std::string& text) {
        std::smatch m;
        if (!std::regex_search(text, m, re)) return false;
        endpoint_ = m[1];
        return true;
      },
      startup_timeout, process_.pidfd());
  if (listening) return;
  if (process_.try_wait())
    throw std::runtime_error("offload service exited during startup: " + log());
  // process_'s destructor kills the silent service.
  throw std::runtime_error("offload service did not report its endpoint: " + log());
}

std::string ServiceProcess::log() const {
  return read_text(log_file_);
}

int ServiceProcess::stop(std::chrono::milliseconds timeout) {
  if (!process_.started() || process_.reaped()) return -1;
  process_.signal(SIGTERM);
  const auto status = process_.wait_for(timeout);
  return status ? exit_code(*status) : -1;
}

}  // namespace dsactor::deploy
