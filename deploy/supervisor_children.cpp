// The children of a deployment (children_for) and the restart policy's backoff.
#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "actors/collectives/job_token.h"
#include "actors/collectives/rendezvous_store.h"
#include "deploy/supervisor.h"
#include "security/curve_keys.h"

namespace dsactor::deploy {

std::chrono::milliseconds RestartPolicy::delay(int n) const {
  auto d = backoff;
  for (int i = 1; i < n && d < backoff_max; ++i) d *= 2;
  return std::min(d, backoff_max);
}

namespace {

// A coordinator is ready once its store answers a round trip: removing a key nobody sets
// changes nothing. The probe proves the coordinator's own key, which its store admits.
std::function<bool()> rendezvous_probe(const DeployConfig& config, const RoleSpec& r,
                                       const std::string& job_token) {
  return [endpoint = r.listen, job = config.job, insecure = config.security.insecure,
          secret_key = r.secret_key, job_token] {
    try {
      security::ClientSecurity keys;
      keys.insecure = insecure;
      if (!insecure) {
        keys.keys = security::read_secret_key_file(secret_key);
        keys.server_key = keys.keys.public_key;
      }
      actors::RendezvousClient probe(endpoint, job, keys, job_token,
                                     std::chrono::milliseconds(500));
      probe.remove("dsactor/up/ready-probe");
      return true;
    } catch (const std::exception&) {
      return false;  // not answering yet (or not our protocol): probe again later
    }
  };
}

// A restarted trainer resumes from the newest durable state: the checkpoint `latest` names
// (the trainer resolves it itself) or its services' committed step, whichever is newer.
// Without a checkpoint, a trainer whose state is on its services continues from their step,
// or starts over when they hold none (--resume-or-start); any other trainer starts over,
// dropping the job its services still hold.
std::function<std::vector<std::string>()> trainer_restart_argv(std::vector<std::string> argv,
                                                               const DeployConfig& config,
                                                               const RoleSpec& trainer) {
  return [argv = std::move(argv), dir = checkpoint_dir_of(config, trainer),
          on_services = trainer.state_on_services] {
    std::vector<std::string> a = argv;
    std::error_code ec;
    if (!dir.empty() && std::filesystem::exists(dir / "latest", ec))
      a.insert(a.end(), {"--resume", dir.string()});
    else
      a.emplace_back(on_services ? "--resume-or-start" : "--overwrite");
    return a;
  };
}

}  // namespace

std::vector<ChildSpec> children_for(const DeployConfig& config, const std::string& binary,
                                    const std::string& job_token) {
  std::vector<ChildSpec> out;
  for (const auto& r : config.roles) {
    ChildSpec c;
    c.name = r.name;
    c.argv = {binary};
    for (auto& a : to_command_line(config, r)) c.argv.push_back(std::move(a));
    c.env = {{"DSACTOR_JOB", config.job}, {"DSACTOR_ROLE_NAME", r.name}};
    for (const auto& kv : r.env) c.env.push_back(kv);
    // The token travels in the environment (readable by this user only), never in an argv.
    if (!job_token.empty() && config.security.job_token_file.empty() &&
        r.kind != RoleKind::kOffload)
      c.env.emplace_back(actors::kJobTokenEnv, job_token);
    c.service = r.kind != RoleKind::kTrainer;
    // Services share the host with trainers and sit idle between requests: OpenMP threads
    // that spin after each Adam pass would take the trainers' cores (measured: a 30-step
    // run varied from 0.1 s to 30 s on 2 loaded cores). Sleep instead, unless the user
    // chose otherwise.
    const bool wait_policy_set = std::getenv("OMP_WAIT_POLICY") != nullptr ||
                                 std::any_of(c.env.begin(), c.env.end(), [](const auto& kv) {
                                   return kv.first == "OMP_WAIT_POLICY";
                                 });
    if (c.service && !wait_policy_set) c.env.emplace_back("OMP_WAIT_POLICY", "passive");
    if (c.service) c.ready_endpoint = r.listen;
    if (r.kind == RoleKind::kCoordinator) c.ready_probe = rendezvous_probe(config, r, job_token);
    c.startup_timeout = std::chrono::milliseconds(static_cast<int64_t>(r.startup_timeout * 1000));
    c.shutdown_timeout = std::chrono::milliseconds(static_cast<int64_t>(r.shutdown_timeout * 1000));
    c.code_index = static_cast<int>(r.index);
    c.restart.on_failure = r.restart == RestartMode::kOnFailure;
    c.restart.max_restarts = r.max_restarts;
    c.restart.backoff = std::chrono::milliseconds(static_cast<int64_t>(r.restart_backoff * 1000));
    c.restart.backoff_max =
        std::chrono::milliseconds(static_cast<int64_t>(r.restart_backoff_max * 1000));
    for (const RoleSpec* g : restart_group(config, r))
      if (g != &r) c.restart_group.push_back(g->name);
    if (r.kind == RoleKind::kTrainer) c.restart_argv = trainer_restart_argv(c.argv, config, r);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace dsactor::deploy
