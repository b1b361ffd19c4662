#pragma once
// The storage a trainer's ds_config asks of the offload services `dsactor up` starts for it:
// `offload_optimizer` / `offload_param` with `device: nvme` want an NVMe tier at
// `nvme_path`, run with the config's `aio` block and buffer count. The caller reads the
// ds_config (deploy/ does not depend on trainer/) and hands the request here.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "deploy/deploy_config.h"

namespace dsactor::deploy {

struct TierRequest {
  std::string trainer;             // the trainer role's name
  std::filesystem::path config;    // its ds_config, for messages
  std::string nvme_key;            // "zero_optimization.offload_optimizer.nvme_path"
  std::filesystem::path nvme_dir;  // absolute (relative nvme_paths resolved against config's dir)
  AioOverrides aio;                // from the ds_config's aio block
  std::optional<unsigned> buffer_count;
};

// Gives every offload role a request's trainer uses (its `offload` list) the requested tier:
// `nvme`, the aio settings and buffer_count, each unless the role sets its own (the deploy
// file wins; a differing nvme directory is returned as a note to log). Throws
// DeployConfigError when two trainers ask one service for different settings, or a setting
// is outside what the service accepts (naming the ds_config key). Returns the notes.
std::vector<std::string> apply_tier_requests(DeployConfig& config,
                                             const std::vector<TierRequest>& requests);

}  // namespace dsactor::deploy
