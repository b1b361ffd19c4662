// Restart policies of a deployment: the keys, the checks that span roles, and which roles
// are restarted together (deploy_config.h says why each belongs to a group).
#include "deploy/deploy_restart.h"

#include <algorithm>

#include <fmt/format.h>

namespace dsactor::deploy {

std::string_view restart_mode_name(RestartMode m) {
  return m == RestartMode::kOnFailure ? "on-failure" : "never";
}

void read_restart_keys(const DeployYaml& yaml, const YAML::Node& map, const std::string& prefix,
                       RoleSpec& r) {
  if (const YAML::Node n = map["restart"]) {
    const std::string path = prefix + "restart";
    const std::string mode = yaml.choice(n, path);
    r.restart = mode == restart_mode_name(RestartMode::kOnFailure) ? RestartMode::kOnFailure
                                                                   : RestartMode::kNever;
  }
  if (const YAML::Node n = map["max_restarts"])
    r.max_restarts = static_cast<int>(yaml.integer(n, prefix + "max_restarts"));
  if (const YAML::Node n = map["restart_backoff"])
    r.restart_backoff = yaml.seconds(n, prefix + "restart_backoff");
  if (const YAML::Node n = map["restart_backoff_max"])
    r.restart_backoff_max = yaml.seconds(n, prefix + "restart_backoff_max");
}

namespace {

// Why a trainer restarted on failure needs a checkpoint directory when its services do not
// hold its state.
constexpr const char* kNeedsCheckpoints =
    "value on-failure needs checkpoints to resume from: set checkpoint.dir (or this trainer's "
    "out), and checkpoint.every to bound the work a restart redoes";

}  // namespace

void check_restart_policies(const DeployYaml& yaml, const DeployConfig& config,
                            const std::vector<YAML::Node>& nodes) {
  for (const auto& r : config.roles) {
    const std::string p = fmt::format("roles[{}]", r.index);
    const YAML::Node& n = nodes[r.index];
    if (r.restart_backoff_max < r.restart_backoff)
      yaml.fail(n["restart_backoff_max"] ? n["restart_backoff_max"] : n, p + ".restart_backoff_max",
                fmt::format("value {} is below restart_backoff {}; the backoff grows from "
                            "restart_backoff up to restart_backoff_max",
                            r.restart_backoff_max, r.restart_backoff));
    if (r.kind != RoleKind::kTrainer || r.restart != RestartMode::kOnFailure) continue;
    // With offload services the trainer may continue from their committed step: whether they
    // hold all of its state is the ds_config's to say (check_restart_sources).
    if (checkpoint_dir_of(config, r).empty() && r.offload.empty())
      yaml.fail(n, p + ".restart",
                fmt::format("{} (this trainer has no offload services, whose committed step "
                            "it could continue from instead)",
                            kNeedsCheckpoints));
    if (r.world_size > 1 && !config.checkpoint.dir)
      yaml.fail(n, p + ".restart",
                fmt::format("value on-failure with world_size {} needs checkpoint.dir: every "
                            "rank must resume from the same step, and a rank killed between "
                            "the ranks' commits leaves their services one step apart, which "
                            "only a checkpoint in one shared directory restores",
                            r.world_size));
  }
}

void check_restart_sources(const DeployConfig& config) {
  for (const auto* r : config.of_kind(RoleKind::kTrainer)) {
    if (r->restart != RestartMode::kOnFailure || r->state_on_services ||
        !checkpoint_dir_of(config, *r).empty())
      continue;
    throw DeployConfigError(fmt::format(
        "{}: roles[{}].restart: {} (its ds_config {} keeps the training state on the trainer, "
        "not all of it on offload services: ZeRO stage 1-3 with offload_optimizer would let "
        "a restart continue from the services' committed step instead)",
        config.source.string(), r->index, kNeedsCheckpoints, r->config.string()));
  }
}

std::filesystem::path checkpoint_dir_of(const DeployConfig& config, const RoleSpec& trainer) {
  if (config.checkpoint.dir) return *config.checkpoint.dir;
  if (!trainer.out.empty()) return std::filesystem::path(trainer.out) / "checkpoint";
  return {};
}

std::vector<const RoleSpec*> restart_group(const DeployConfig& config, const RoleSpec& role) {
  std::vector<bool> in(config.roles.size(), false);
  in[role.index] = true;
  // A restarted trainer continues from its services' committed step (or a newer
  // checkpoint): a trainer's failure leaves the services and their state running. A
  // service's failure takes the step in flight of the trainers it serves: they restart with
  // it. Either way every trainer restarts, so data-parallel ranks resume from one step, and
  // the coordinator too, for a fresh rendezvous; other services run on.
  const bool trainers_in_group =
      role.kind == RoleKind::kTrainer || !config.clients_of(role).empty();
  if (trainers_in_group) {
    for (const auto* t : config.of_kind(RoleKind::kTrainer)) in[t->index] = true;
    for (const auto* c : config.of_kind(RoleKind::kCoordinator)) in[c->index] = true;
  }
  std::vector<const RoleSpec*> out;
  for (const auto& r : config.roles)
    if (in[r.index]) out.push_back(&r);
  return out;
}

}  // namespace dsactor::deploy
