#include "deploy/service_process.h"

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <stdexcept>

#include "deploy/file_watch.h"

namespace dsactor::deploy {

namespace fs = std::filesystem;

namespace {

bool has_flag(const std::vector<std::string>& args, const std::string& flag) {
  return std::find(args.begin(), args.end(), flag) != args.end();
}

// The keypair `name` in `dir`, made when missing.
security::CurveKeypair keypair(const fs::path& dir, const std::string& name) {
  const fs::path secret = dir / (name + ".key_secret");
  if (!fs::exists(secret)) security::write_keypair(dir, name, security::generate_keypair());
  return security::read_secret_key_file(secret);
}

}  // namespace

std::vector<std::string> ServiceProcess::keys_flags(const ServiceProcessOptions& o) {
  if (has_flag(o.args, "--insecure")) return {};
  keys_dir_ = o.keys_dir;
  if (keys_dir_.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "dsactor-service-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("offload service: mkdtemp failed");
    keys_dir_ = tmpl;
    own_keys_dir_ = true;
  }
  const auto service = keypair(keys_dir_, "service");
  client_ = security::ClientSecurity{false, keypair(keys_dir_, "client"), service.public_key};
  const fs::path authorized = keys_dir_ / "authorized_keys";
  {
    std::ofstream out(authorized);
    out << client_.keys.public_key << " client\n";
    for (const auto& k : o.extra_client_keys) out << k << "\n";
  }
  return {"--secret-key", (keys_dir_ / "service.key_secret").string(), "--authorized-keys",
          authorized.string()};
}

ServiceProcess::ServiceProcess(const std::string& binary, const std::vector<std::string>& args,
                               fs::path log_file, std::chrono::milliseconds startup_timeout)
    : ServiceProcess(
          binary, ServiceProcessOptions{args, std::move(log_file), startup_timeout, {}, {}, {}}) {}

ServiceProcess::ServiceProcess(const std::string& binary, ServiceProcessOptions options)
    : log_file_(std::move(options.log_file)) {
  std::vector<std::string> argv{binary, "start", "--role", "offload"};
  // A service restarted on its endpoint names it; otherwise any free port.
  if (!has_flag(options.args, "--listen"))
    argv.insert(argv.end(), {"--listen", "tcp://127.0.0.1:*"});
  argv.insert(argv.end(), options.args.begin(), options.args.end());
  try {
    const auto keys = keys_flags(options);
    argv.insert(argv.end(), keys.begin(), keys.end());
    if (!has_flag(options.args, "--state-dir") && !has_flag(options.args, "--nvme")) {
      if (keys_dir_.empty()) {
        std::string tmpl = (fs::temp_directory_path() / "dsactor-service-XXXXXX").string();
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("offload service: mkdtemp failed");
        keys_dir_ = tmpl;
        own_keys_dir_ = true;
      }
      argv.insert(argv.end(), {"--state-dir", (keys_dir_ / "state").string()});
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("offload service: keys: ") + e.what());
  }
  ChildOptions child;
  child.out = Output::null();
  child.err = Output::to_file(log_file_);
  if (!std::getenv("OMP_WAIT_POLICY")) child.env.emplace_back("OMP_WAIT_POLICY", "passive");
  child.env.insert(child.env.end(), options.env.begin(), options.env.end());
  try {
    process_ = ChildProcess::exec(argv, child);
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
      options.startup_timeout, process_.pidfd());
  if (listening) return;
  if (process_.try_wait())
    throw std::runtime_error("offload service exited during startup: " + log());
  // process_'s destructor kills the silent service.
  throw std::runtime_error("offload service did not report its endpoint: " + log());
}

ServiceProcess::~ServiceProcess() {
  process_ = ChildProcess();  // killed and reaped before its files go
  if (own_keys_dir_) {
    std::error_code ec;
    fs::remove_all(keys_dir_, ec);
  }
}

std::vector<std::string> ServiceProcess::trainer_flags() const {
  if (client_.insecure) return {"--insecure"};
  return {"--secret-key", (keys_dir_ / "client.key_secret").string(), "--offload-key",
          (keys_dir_ / "service.key").string()};
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
