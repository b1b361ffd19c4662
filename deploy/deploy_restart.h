#pragma once
// Internal to deploy/: the restart keys of the deployment file (`restart`, `max_restarts`,
// `restart_backoff`, `restart_backoff_max`), at the top level for every role and per role,
// and the checks that span roles (a trainer that may be restarted needs checkpoints to
// resume from).
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "deploy/deploy_config.h"
#include "deploy/deploy_yaml.h"

namespace dsactor::deploy {

// Reads the restart keys present in `map` (the document root, prefix "", or a roles entry,
// prefix "roles[i].") into `r`; absent keys leave `r` as it is.
void read_restart_keys(const DeployYaml& yaml, const YAML::Node& map, const std::string& prefix,
                       RoleSpec& r);

// Refuses `restart: on-failure` for a trainer with nowhere to resume from (no checkpoint.dir,
// no out and no offload services), and for data-parallel trainers without one shared
// checkpoint.dir (every rank must resume from the same step). `nodes[i]`: the YAML of
// roles[i], for the line. A trainer with offload services but no checkpoint directory
// passes here; check_restart_sources decides once its ds_config is read.
void check_restart_policies(const DeployYaml& yaml, const DeployConfig& config,
                            const std::vector<YAML::Node>& nodes);

}  // namespace dsactor::deploy
