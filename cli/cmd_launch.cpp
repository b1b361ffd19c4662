#include <signal.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "actors/collectives/job_token.h"
#include "cli/commands.h"
#include "cli/self_binary.h"
#include "deploy/batch_launch.h"
#include "deploy/deepspeed_env.h"
#include "deploy/host_selection.h"
#include "deploy/launch_env.h"
#include "deploy/launcher.h"
#include "deploy/supervisor.h"

namespace dsactor::cli {

namespace {

namespace fs = std::filesystem;

struct LaunchArgs {
  std::string hostfile;
  std::string launcher = "ssh";
  std::string master_addr;
  int master_port = 29500;
  bool dry_run = false;
  std::string remote_binary;
  std::string workdir;
  std::vector<std::string> trainer_args;
  deploy::HostFilter filter;
  // Passed to every rank (docs/security.md); paths as the hosts see them.
  std::string secret_key, authorized_keys, coordinator_key, job_token_file;
  bool insecure = false;
};

// Exit codes: 0 every rank exited 0; 2 (kExitConfig) bad hostfile or arguments; 100 + rank
// (at most 199) that rank failed; 128 + signal when stopped.
bool batch_launcher(const std::string& launcher) {
  return launcher == "openmpi" || launcher == "slurm";
}

// The launcher's program (+ args): $DSACTOR_LAUNCH_<NAME>, else empty (its default).
std::vector<std::string> launcher_program(const std::string& launcher) {
  const std::string env_name = "DSACTOR_LAUNCH_" + std::string(launcher == "openmpi" ? "MPIRUN"
                                                               : launcher == "slurm" ? "SRUN"
                                                               : launcher == "pdsh"  ? "PDSH"
                                                                                     : "SSH");
  const char* t = std::getenv(env_name.c_str());
  return t ? deploy::split_words(t) : std::vector<std::string>{};
}

[[noreturn]] void refuse(const std::string& why) {
  spdlog::error("dsactor launch: {}", why);
  throw CLI::RuntimeError(kExitConfig);
}

// The key flags every rank gets, added to the trainer arguments unless they hold them
// already. Rank 0 serves the rendezvous with its --secret-key, so by default the ranks share
// one keypair: the coordinator key is the secret key's own public half.
void add_key_flags(const LaunchArgs& a, std::vector<std::string>& args) {
  auto add = [&](const char* flag, const std::string& value) {
    if (!value.empty() && !deploy::has_flag(args, flag)) args.insert(args.end(), {flag, value});
  };
  if (a.insecure) {
    if (!deploy::has_flag(args, "--insecure")) args.emplace_back("--insecure");
    return;
  }
  add("--secret-key", a.secret_key);
  if (!deploy::has_flag(args, "--secret-key"))
    refuse(
        "every rank needs --secret-key FILE (the same path on every host; `dsactor keygen`, "
        "docs/security.md), or --insecure on one host");
  add("--coordinator-key", a.coordinator_key.empty() ? a.secret_key : a.coordinator_key);
  add("--authorized-keys", a.authorized_keys);
}

// The run's job token when the launch hands it over (ssh: on each rank's stdin; mpirun and
// srun: in their environment, which they pass on): DSACTOR_JOB_TOKEN of this process, else a
// fresh one. Empty when the ranks read a --job-token-file or run --insecure.
std::string launch_token(const LaunchArgs& a, std::vector<std::string>& args) {
  if (!a.job_token_file.empty() && !deploy::has_flag(args, "--job-token-file"))
    args.insert(args.end(), {"--job-token-file", a.job_token_file});
  if (a.insecure || deploy::has_flag(args, "--job-token-file")) return {};
  if (a.launcher == "pdsh")
    refuse(
        "pdsh does not pass stdin on, so the run's job token cannot reach the ranks privately: "
        "give --job-token-file FILE (the same path on every host, mode 0600)");
  try {
    const auto token = actors::job_token_from(std::nullopt);
    return token ? *token : actors::generate_job_token();
  } catch (const actors::JobTokenError& e) {
    refuse(e.what());
  }
}

// openmpi / slurm: one mpirun or srun command runs every rank.
std::vector<deploy::RankCommand> plan_batch(const LaunchArgs& a,
                                            const std::vector<deploy::SelectedHost>& hosts,
                                            const deploy::LaunchPlanOptions& o) {
  deploy::RankCommand c;
  c.host = hosts.front().host;
  c.argv = deploy::plan_batch_launch(
      a.launcher == "openmpi" ? deploy::BatchLauncher::kOpenMpi : deploy::BatchLauncher::kSlurm,
      hosts, o, launcher_program(a.launcher));
  return {c};
}

void run_launch(const LaunchArgs& a) {
  deploy::LaunchPlanOptions o;
  o.transport =
      a.launcher == "pdsh" ? deploy::LaunchTransport::kPdsh : deploy::LaunchTransport::kSsh;
  o.transport_command = launcher_program(a.launcher);
  o.master_addr = a.master_addr;
  o.master_port = a.master_port;
  // The same install path and working directory on every host, as DeepSpeed assumes.
  o.workdir = a.workdir.empty() ? fs::current_path().string() : a.workdir;
  o.binary = a.remote_binary.empty() ? self_binary("dsactor launch") : a.remote_binary;
  o.trainer_args = a.trainer_args;
  std::vector<deploy::SelectedHost> hosts;
  try {  // the hostfile's errors come first
    hosts = deploy::select_hosts(deploy::parse_hostfile(a.hostfile), a.filter);
  } catch (const deploy::LaunchConfigError& e) {
    refuse(e.what());
  }
  add_key_flags(a, o.trainer_args);
  const std::string token = launch_token(a, o.trainer_args);
  o.token_on_stdin = !token.empty() && !batch_launcher(a.launcher);
  o.token_in_env = !token.empty() && batch_launcher(a.launcher);
  std::vector<deploy::RankCommand> plan;
  try {
    o.exports = deploy::launch_exports(deploy::deepspeed_env_dirs(), deploy::process_env,
                                       deploy::process_env_names());
    plan = batch_launcher(a.launcher) ? plan_batch(a, hosts, o) : deploy::plan_launch_on(hosts, o);
  } catch (const deploy::LaunchConfigError& e) {
    spdlog::error("{}", e.what());
    throw CLI::RuntimeError(kExitConfig);
  }

  auto name_of = [&](const deploy::RankCommand& c) {
    if (batch_launcher(a.launcher)) return a.launcher;
    return "rank " + std::to_string(c.rank) + "@" + c.host;
  };
  if (a.dry_run) {
    std::printf("# %s from %s over %s\n",
                batch_launcher(a.launcher) ? "one command for every rank"
                                           : (std::to_string(plan.size()) + " rank(s)").c_str(),
                a.hostfile.c_str(), a.launcher.c_str());
    for (const auto& c : plan)
      std::printf("[%s] %s\n", name_of(c).c_str(), deploy::shell_quote(c.argv).c_str());
    std::fflush(stdout);
    return;
  }

  std::vector<deploy::ChildSpec> children;
  for (const auto& c : plan) {
    deploy::ChildSpec s;
    s.name = name_of(c);
    s.argv = c.argv;
    s.code_index = std::min(c.rank, 99);  // exit code 100 + rank, capped at 199
    if (o.token_on_stdin) s.stdin_text = token + "\n";
    if (o.token_in_env) s.env.emplace_back(actors::kJobTokenEnv, token);
    children.push_back(std::move(s));
  }
  deploy::SupervisorOptions opt;
  opt.stop_signals = {SIGINT, SIGTERM, SIGHUP};
  deploy::Supervisor sup(std::move(children), opt);
  spdlog::info("dsactor launch: {} rank(s) from {} over {}", plan.size(), a.hostfile, a.launcher);
  const auto result = sup.run();
  if (result.exit_code == 0) {
    spdlog::info("dsactor launch: every rank exited 0");
    return;
  }
  for (const auto& c : plan) {
    if (name_of(c) != result.failed) continue;
    if (batch_launcher(a.launcher))
      spdlog::error("dsactor launch: {} failed (exit code {}): {}", a.launcher, result.exit_code,
                    result.message);
    else
      spdlog::error(
          "dsactor launch: rank {} on host {} failed (exit code {}; the other ranks were "
          "stopped): {}",
          c.rank, c.host, result.exit_code, result.message);
  }
  if (result.failed.empty()) spdlog::warn("dsactor launch: {}", result.message);
  throw CLI::RuntimeError(result.exit_code);
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "launch",
      "start `dsactor start --role trainer ARGS` on every slot of a DeepSpeed hostfile over "
      "ssh or pdsh (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set per rank), or "
      "with one mpirun or srun; one failing rank stops the others");
  auto a = std::make_shared<LaunchArgs>();
  cmd->add_option("--hostfile", a->hostfile, "DeepSpeed hostfile: `host slots=N` per line")
      ->required();
  cmd->add_option("--launcher", a->launcher,
                  "ssh: one `ssh HOST CMD` per rank (program: $DSACTOR_LAUNCH_SSH, default "
                  "ssh); pdsh: one `pdsh -S -w HOST CMD` per rank ($DSACTOR_LAUNCH_PDSH); "
                  "openmpi: one mpirun for every rank ($DSACTOR_LAUNCH_MPIRUN); slurm: one "
                  "srun ($DSACTOR_LAUNCH_SRUN)")
      ->check(CLI::IsMember({"ssh", "pdsh", "openmpi", "slurm"}))
      ->capture_default_str();
  cmd->add_option("--master-addr,--master_addr", a->master_addr,
                  "MASTER_ADDR of every rank (default: the first selected host)");
  cmd->add_option("--master-port,--master_port", a->master_port, "MASTER_PORT of every rank")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  cmd->add_option("-i,--include", a->filter.include,
                  "only these hosts/slots: HOST[:SLOT,...][@HOST[:SLOT,...]...] (DeepSpeed's "
                  "syntax; a host without slots means all of them)");
  cmd->add_option("-e,--exclude", a->filter.exclude,
                  "every host/slot but these, same syntax as --include");
  cmd->add_option("--num-nodes,--num_nodes", a->filter.num_nodes,
                  "the first N selected hosts (default: all)");
  cmd->add_option("--num-gpus,--num_gpus", a->filter.num_gpus,
                  "the first N selected slots of each host (default: all)");
  cmd->add_flag("--dry-run", a->dry_run, "print each rank's command line, start nothing");
  cmd->add_option("--remote-binary", a->remote_binary,
                  "path of dsactor on the hosts (default: this binary's own path)");
  cmd->add_option("--workdir", a->workdir,
                  "directory the ranks run in on every host (default: the current directory)");
  cmd->add_option("--secret-key", a->secret_key,
                  "every rank's --secret-key (a path on the hosts; rank 0 serves the rendezvous "
                  "with it)");
  cmd->add_option("--coordinator-key", a->coordinator_key,
                  "every rank's --coordinator-key: rank 0's public key (default: --secret-key's "
                  "public half, when the ranks share one keypair)");
  cmd->add_option("--authorized-keys", a->authorized_keys,
                  "every rank's --authorized-keys: the keys rank 0's rendezvous admits, when "
                  "the ranks hold keys of their own");
  cmd->add_option("--job-token-file", a->job_token_file,
                  "every rank's --job-token-file (default: a token per run, or "
                  "$DSACTOR_JOB_TOKEN, on each ssh's stdin or in mpirun's/srun's environment)");
  cmd->add_flag("--insecure", a->insecure, "every rank's --insecure (one host, loopback only)");
  cmd->add_option("trainer_args", a->trainer_args,
                  "after `--`: the arguments of `dsactor start --role trainer` (not --rank or "
                  "--world-size: the launch sets them)");
  cmd->footer(
      "Example: dsactor launch --hostfile hosts --secret-key keys/job.key_secret -- --config "
      "ds.json --offload tcp://127.0.0.1:5555\n"
      "Every rank also gets the NAME=VALUE lines of .deepspeed_env ($DS_ENV_FILE) in the home "
      "and current directory, and the launching shell's NCCL*, UCX*, MV2* and DSACTOR_LOG.\n"
      "Exit codes: 0 every rank exited 0; 2 bad hostfile or arguments; 100+r rank r failed (at "
      "most 199; logged with its host and last stderr lines); 128+N stopped by signal N.");
  cmd->callback([a] { run_launch(*a); });
}

}  // namespace dsactor::cli
