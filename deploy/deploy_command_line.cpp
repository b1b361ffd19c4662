// The `dsactor start --role ...` argv of a deployment's role (format in deploy_config.h).
// Only what the file sets is passed: an unset key leaves the role's own default.
#include <string>
#include <vector>

#include "deploy/deploy_config.h"

namespace dsactor::deploy {

namespace {

using Args = std::vector<std::string>;

void add_file(Args& a, const char* flag, const std::filesystem::path& file) {
  if (!file.empty()) a.insert(a.end(), {flag, file.string()});
}

// The keys of a role (docs/security.md): what it proves, whom it admits, whom it expects.
void add_security(Args& a, const DeployConfig& config, const RoleSpec& role) {
  if (config.security.insecure) {
    a.emplace_back("--insecure");
  } else {
    add_file(a, "--secret-key", role.secret_key);
    if (config.is_server(role)) add_file(a, "--authorized-keys", role.authorized_keys);
    if (role.kind == RoleKind::kTrainer) {
      for (const auto& name : role.offload)
        if (const RoleSpec* o = config.find(name)) add_file(a, "--offload-key", o->public_key);
      if (!config.is_server(role)) add_file(a, "--coordinator-key", config.rendezvous_key());
    }
  }
  if (role.kind != RoleKind::kOffload && !config.rendezvous.empty())
    add_file(a, "--job-token-file", config.security.job_token_file);
}

}  // namespace

std::vector<std::string> to_command_line(const DeployConfig& config, const RoleSpec& role) {
  Args a = {"start", "--role", std::string(role_kind_name(role.kind))};
  switch (role.kind) {
    case RoleKind::kOffload:
      a.insert(a.end(), {"--listen", role.listen});
      if (role.nvme) a.insert(a.end(), {"--nvme", role.nvme->string()});
      if (role.memory_limit)
        a.insert(a.end(), {"--memory-limit", std::to_string(*role.memory_limit)});
      if (role.aio.block_size)
        a.insert(a.end(), {"--aio-block-size", std::to_string(*role.aio.block_size)});
      if (role.aio.queue_depth)
        a.insert(a.end(), {"--aio-queue-depth", std::to_string(*role.aio.queue_depth)});
      if (role.aio.single_submit)
        a.insert(a.end(), {"--aio-single-submit", *role.aio.single_submit ? "true" : "false"});
      if (role.aio.overlap_events)
        a.insert(a.end(), {"--aio-overlap-events", *role.aio.overlap_events ? "true" : "false"});
      if (role.buffer_count)
        a.insert(a.end(), {"--buffer-count", std::to_string(*role.buffer_count)});
      if (role.mlock == false) a.emplace_back("--no-mlock");
      if (role.max_arena) a.insert(a.end(), {"--max-arena", std::to_string(*role.max_arena)});
      if (!role.metrics_listen.empty())
        a.insert(a.end(), {"--metrics-listen", role.metrics_listen});
      break;
    case RoleKind::kTrainer:
      a.insert(a.end(), {"--name", role.name, "--deploy", config.source.string(), "--config",
                         role.config.string(), "--rank", std::to_string(role.rank), "--world-size",
                         std::to_string(role.world_size), "--job", config.job});
      for (const auto& name : role.offload)
        if (const RoleSpec* o = config.find(name)) a.insert(a.end(), {"--offload", o->listen});
      if (!role.model.empty()) a.insert(a.end(), {"--model", role.model});
      if (!role.data.empty()) a.insert(a.end(), {"--data", role.data});
      if (!role.tokenizer.empty()) a.insert(a.end(), {"--tokenizer", role.tokenizer});
      if (role.steps) a.insert(a.end(), {"--steps", std::to_string(role.steps)});
      if (!role.out.empty()) a.insert(a.end(), {"--out", role.out});
      if (role.shared_memory == false) a.emplace_back("--no-shared-memory");
      if (!role.metrics_listen.empty())
        a.insert(a.end(), {"--metrics-listen", role.metrics_listen});
      for (const auto& [key, value] : role.config_overrides)
        a.insert(a.end(), {"--set", key + "=" + value});
      if (const auto& c = config.checkpoint; c.every)
        a.insert(a.end(), {"--checkpoint-every", std::to_string(*c.every)});
      if (const auto& c = config.checkpoint; c.keep_last)
        a.insert(a.end(), {"--keep-last", std::to_string(*c.keep_last)});
      if (const auto& c = config.checkpoint; c.dir)
        a.insert(a.end(), {"--checkpoint-dir", c.dir->string()});
      if (!config.rendezvous.empty()) {
        a.insert(a.end(), {"--coordinator", config.rendezvous});
        if (config.rendezvous_in_rank0 && role.rank == 0) a.emplace_back("--serve-coordinator");
      }
      if (!role.comm_interface.empty())
        a.insert(a.end(), {"--comm-interface", role.comm_interface});
      if (!role.comm_address.empty()) a.insert(a.end(), {"--comm-address", role.comm_address});
      break;
    case RoleKind::kCoordinator:
      a.insert(a.end(),
               {"--name", role.name, "--deploy", config.source.string(), "--listen", role.listen});
      if (!role.metrics_listen.empty())
        a.insert(a.end(), {"--metrics-listen", role.metrics_listen});
      break;
  }
  add_security(a, config, role);
  return a;
}

}  // namespace dsactor::deploy
