#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

#include "actors/collectives/job_token.h"
#include "cli/commands.h"
#include "cli/self_binary.h"
#include "cli/up_dashboard.h"
#include "deploy/deploy_config.h"
#include "deploy/run_keys.h"
#include "deploy/service_tiers.h"
#include "deploy/supervisor.h"
#include "trainer/config/ds_config.h"
#include "trainer/run_plan.h"

namespace dsactor::cli {

namespace {

namespace fs = std::filesystem;

struct UpArgs {
  std::string deploy;
  bool dry_run = false;
  bool make_keys = false;
};

// Exit codes: 0 success; 2 the deploy file or a trainer's ds_config is wrong; 3 a directory could
// not be created, or the dashboard's address not bound; 100 + i the role roles[i] failed; 128 +
// signal when stopped by SIGINT/SIGTERM/SIGHUP.
constexpr int kExitSetup = 3;

// What a dry run shows for the per-run keys directory, which it does not make.
const char* const kRunKeysPlaceholder = "<run keys>";

void print_dry_run(const deploy::DeployConfig& cfg,
                   const std::vector<deploy::ChildSpec>& children) {
  std::printf("# job %s from %s: %zu role(s); services start first, trainers once they answer\n",
              cfg.job.c_str(), cfg.source.c_str(), children.size());
  if (cfg.security.insecure)
    std::printf("# security.insecure: plain ZeroMQ on loopback, no keys\n");
  else
    std::printf(
        "# keys in %s%s; the job token %s\n", cfg.security.keys_dir.c_str(),
        cfg.security.keys_dir == kRunKeysPlaceholder ? " (a fresh 0700 directory per run)" : "",
        cfg.security.job_token_file.empty() ? "is made per run (DSACTOR_JOB_TOKEN)"
                                            : "is in security.job_token_file");
  for (const auto& c : children) {
    std::string env;
    for (const auto& [k, v] : c.env)
      env += deploy::shell_quote({k + "=" + (k == actors::kJobTokenEnv ? "<token>" : v)}) + " ";
    std::printf("[%s] %s%s\n", c.name.c_str(), env.c_str(), deploy::shell_quote(c.argv).c_str());
  }
  if (!cfg.dashboard_listen.empty())
    std::printf(
        "# dashboard on %s; each role without metrics_listen gets "
        "--metrics-listen 127.0.0.1:<a free port>\n",
        cfg.dashboard_listen.c_str());
  std::fflush(stdout);
}

// The NVMe tier a trainer's ds_config asks for (offload_optimizer first, as its buffers
// are the ones the service's staging serves), with the config's aio block; none when
// neither offload section says nvme.
std::optional<deploy::TierRequest> tier_request(const deploy::RoleSpec& t,
                                                const trainer::DsConfig& c) {
  const auto& z = c.zero_optimization;
  const bool opt = z.offload_optimizer.device == trainer::OffloadDevice::kNvme;
  if (!opt && z.offload_param.device != trainer::OffloadDevice::kNvme) return std::nullopt;
  deploy::TierRequest r;
  r.trainer = t.name;
  r.config = t.config;
  r.nvme_key = opt ? "zero_optimization.offload_optimizer.nvme_path"
                   : "zero_optimization.offload_param.nvme_path";
  const fs::path path(opt ? z.offload_optimizer.nvme_path : z.offload_param.nvme_path);
  r.nvme_dir = (path.is_absolute() ? path : t.config.parent_path() / path).lexically_normal();
  r.aio.block_size = static_cast<uint64_t>(c.aio.block_size);
  r.aio.queue_depth = static_cast<unsigned>(std::min<int64_t>(c.aio.queue_depth, 1 << 20));
  r.aio.single_submit = c.aio.single_submit;
  r.aio.overlap_events = c.aio.overlap_events;
  r.buffer_count = static_cast<unsigned>(std::min<int64_t>(
      opt ? z.offload_optimizer.buffer_count : z.offload_param.buffer_count, 1 << 20));
  return r;
}

// Reads every trainer's ds_config (with its config_overrides) before anything starts, so a
// config that cannot run is reported now, the offload roles get the NVMe tier the configs
// ask for, and a trainer restarted on failure has something durable to resume from.
void apply_trainer_configs(deploy::DeployConfig& cfg) {
  std::vector<deploy::TierRequest> requests;
  for (auto& t : cfg.roles) {
    if (t.kind != deploy::RoleKind::kTrainer) continue;
    std::vector<trainer::ConfigOverride> overrides;
    for (const auto& [key, value] : t.config_overrides) overrides.push_back({key, value});
    const trainer::DsConfig c = trainer::load_ds_config(t.config, t.world_size, overrides);
    t.state_on_services = trainer::state_on_services(c, t.offload.size());
    if (auto r = tier_request(t, c)) requests.push_back(std::move(*r));
  }
  for (const auto& note : deploy::apply_tier_requests(cfg, requests)) spdlog::warn("{}", note);
  deploy::check_restart_sources(cfg);
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

// `up --make-keys`: the keys, allow-lists and token file of a deployment whose keys are
// copied to other machines; nothing starts.
void make_keys(const deploy::DeployConfig& cfg) {
  if (cfg.security.insecure || cfg.security.keys_dir.empty()) {
    spdlog::error("{}: --make-keys needs security.keys_dir (and no security.insecure)",
                  cfg.source.string());
    throw CLI::RuntimeError(kExitConfig);
  }
  deploy::make_run_keys(cfg);
  if (!cfg.security.job_token_file.empty()) deploy::run_job_token(cfg, /*create_file=*/true);
  std::printf("# keys of job %s in %s\n", cfg.job.c_str(), cfg.security.keys_dir.c_str());
  for (const auto& r : cfg.roles)
    std::printf("[%s] secret %s%s%s\n", r.name.c_str(), r.secret_key.c_str(),
                cfg.is_server(r) ? ", public " : "",
                cfg.is_server(r)
                    ? (r.public_key.string() + ", admits " + r.authorized_keys.string()).c_str()
                    : "");
  if (!cfg.security.job_token_file.empty())
    std::printf("# job token in %s\n", cfg.security.job_token_file.c_str());
  std::fflush(stdout);
}

void run_up(const UpArgs& a) {
  deploy::DeployConfig cfg;
  std::optional<deploy::RunKeysDir> run_keys;  // removed when `up` ends, however it ends
  std::string token;
  try {
    cfg = deploy::load_deploy_config(a.deploy);
    if (a.make_keys) return make_keys(cfg);
    apply_trainer_configs(cfg);
    if (!cfg.security.insecure && cfg.security.keys_dir.empty()) {
      if (a.dry_run) {
        deploy::resolve_key_files(cfg, kRunKeysPlaceholder);
      } else {
        run_keys.emplace();
        deploy::resolve_key_files(cfg, run_keys->path());
      }
    }
    if (!a.dry_run) {
      deploy::make_run_keys(cfg);
      token = deploy::run_job_token(cfg);
    }
  } catch (const deploy::DeployConfigError& e) {
    spdlog::error("{}", e.what());
    throw CLI::RuntimeError(kExitConfig);
  } catch (const trainer::ConfigError& e) {
    spdlog::error("{}", e.what());
    throw CLI::RuntimeError(kExitConfig);
  }
  for (const auto& w : deploy::remote_listener_warnings(cfg)) spdlog::warn("{}", w);
  if (cfg.security.insecure)
    spdlog::warn(
        "dsactor up: security.insecure: the roles run WITHOUT authentication (loopback "
        "only)");
  if (a.dry_run) {
    print_dry_run(cfg, deploy::children_for(cfg, self_binary("dsactor up"), "<token>"));
    return;
  }
  const std::string metrics_token = prepare_role_metrics(cfg);
  auto children = deploy::children_for(cfg, self_binary("dsactor up"), token);
  pass_metrics_token(children, metrics_token);
  create_dirs(cfg);
  std::unique_ptr<metrics::Dashboard> dashboard;
  try {
    dashboard = start_dashboard(cfg, metrics_token);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    throw CLI::RuntimeError(kExitSetup);
  }

  deploy::SupervisorOptions opt;
  opt.stop_signals = {SIGINT, SIGTERM, SIGHUP};
  deploy::Supervisor sup(children, opt);
  spdlog::info(
      "dsactor up: job {} with {} role(s) from {} ({})", cfg.job, children.size(),
      cfg.source.string(),
      cfg.security.insecure ? "no authentication" : "keys in " + cfg.security.keys_dir.string());
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
  cmd->add_flag("--make-keys", a->make_keys,
                "write the missing keypairs, the servers' allow-lists and the job token file "
                "into security.keys_dir (to copy to other machines), start nothing");
  cmd->footer(
      "Exit codes: 0 every trainer exited 0; 2 invalid deploy file or trainer ds_config; 3 a "
      "directory could not be created or the dashboard address not bound; 100+i roles[i] failed "
      "(its exit code and last stderr lines "
      "are logged); 128+N "
      "stopped by signal N.");
  cmd->callback([a] { run_up(*a); });
}

}  // namespace dsactor::cli
