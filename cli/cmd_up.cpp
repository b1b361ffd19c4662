#include <signal.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "cli/commands.h"
#include "deploy/deploy_config.h"
#include "deploy/supervisor.h"

namespace dsactor::cli {

namespace {

namespace fs = std::filesystem;

struct UpArgs {
  std::string deploy;
  bool dry_run = false;
};

// Exit codes: 0 success; 2 the deploy file is wrong; 3 a directory could not be created;
// 100 + i the role roles[i] failed; 128 + signal when stopped by SIGINT/SIGTERM/SIGHUP.
constexpr int kExitConfig = 2;
constexpr int kExitSetup = 3;

// Children run this very binary, so `up` and `start` always match.
std::string self_binary() {
  std::error_code ec;
  const auto p = fs::read_symlink("/proc/self/exe", ec);
  if (ec)
    throw std::runtime_error("dsactor up: cannot find its own binary (/proc/self/exe): " +
                             ec.message());
  return p.string();
}

void print_dry_run(const deploy::DeployConfig& cfg,
                   const std::vector<deploy::ChildSpec>& children) {
  std::printf("# job %s from %s: %zu role(s); services start first, trainers once they answer\n",
              cfg.job.c_str(), cfg.source.c_str(), children.size());
  for (const auto& c : children) {
    std::string env;
    for (const auto& [k, v] : c.env) env += deploy::shell_quote({k + "=" + v}) + " ";
    std::printf("[%s] %s%s\n", c.name.c_str(), env.c_str(), deploy::shell_quote(c.argv).c_str());
  }
  std::fflush(stdout);
}

// `nvme` and `out` directories are created before anything starts, so a typo'd mount point
// fails here with its path rather than inside a child.
void create_dirs(const deploy::DeployConfig& cfg) {
  if (!cfg.create_dirs) return;
  for (const auto& r : cfg.roles) {
    for (const auto& dir : {r.nvme ? r.nvme->string() : std::string(), r.out}) {
      if (dir.empty()) continue;
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) {
        spdlog::error("{}: role \"{}\": cannot create directory {}: {}", cfg.source.string(),
                      r.name, dir, ec.message());
        throw CLI::RuntimeError(kExitSetup);
      }
    }
  }
}

void run_up(const UpArgs& a) {
  deploy::DeployConfig cfg;
  try {
    cfg = deploy::load_deploy_config(a.deploy);
  } catch (const deploy::DeployConfigError& e) {
    spdlog::error("{}", e.what());
    throw CLI::RuntimeError(kExitConfig);
  }
  const auto children = deploy::children_for(cfg, self_binary());
  if (a.dry_run) {
    print_dry_run(cfg, children);
    return;
  }
  create_dirs(cfg);

  deploy::SupervisorOptions opt;
  opt.stop_signals = {SIGINT, SIGTERM, SIGHUP};
  deploy::Supervisor sup(children, opt);
  spdlog::info("dsactor up: job {} with {} role(s) from {}", cfg.job, children.size(),
               cfg.source.string());
  const auto result = sup.run();
  if (result.exit_code == 0) {
    spdlog::info("dsactor up: every trainer finished; all roles stopped");
    return;
  }
  if (!result.failed.empty())
    spdlog::error("dsactor up: exit code {} (100 + the index of the failed role in roles): {}",
                  result.exit_code, result.message);
  else
    spdlog::warn("dsactor up: {}", result.message);
  throw CLI::RuntimeError(result.exit_code);
}

}  // namespace

void add_up_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "up",
      "start every role of a deployment file on this machine (services first, then trainers), "
      "stream their logs, stop them all on Ctrl-C or when one fails");
  auto a = std::make_shared<UpArgs>();
  cmd->add_option("deploy", a->deploy, "deployment YAML (see configs/deploy_local.yaml)")
      ->required();
  cmd->add_flag("--dry-run", a->dry_run,
                "print each role's environment and command line, start nothing");
  cmd->footer(
      "Exit codes: 0 every trainer exited 0; 2 invalid deploy file; 3 a directory could not be "
      "created; 100+i roles[i] failed (its exit code and last stderr lines are logged); 128+N "
      "stopped by signal N.");
  cmd->callback([a] { run_up(*a); });
}

}  // namespace dsactor::cli
