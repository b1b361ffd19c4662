#include "deploy/service_tiers.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace dsactor::deploy {
namespace {

// What the offload service accepts (its --aio-block-size, --aio-queue-depth and
// --buffer-count checks), checked here so the message names the ds_config key.
void check_request(const TierRequest& r) {
  const std::string where = r.config.string();
  if (r.aio.block_size &&
      (*r.aio.block_size == 0 || *r.aio.block_size % 4096 != 0 || *r.aio.block_size > (1u << 30)))
    throw DeployConfigError(fmt::format(
        "{}: aio.block_size: value {} is not allowed for the NVMe tier of the offload services "
        "`dsactor up` starts for trainer \"{}\"; expected a multiple of 4096 up to 1GiB",
        where, *r.aio.block_size, r.trainer));
  if (r.aio.queue_depth && (*r.aio.queue_depth < 1 || *r.aio.queue_depth > 4096))
    throw DeployConfigError(fmt::format(
        "{}: aio.queue_depth: value {} is not allowed for the NVMe tier; expected 1..4096", where,
        *r.aio.queue_depth));
  if (r.buffer_count && (*r.buffer_count < 3 || *r.buffer_count > 1024))
    throw DeployConfigError(fmt::format(
        "{}: buffer_count: value {} is not allowed for the NVMe tier of the offload services "
        "`dsactor up` starts for trainer \"{}\"; dsactor's staging needs 3..1024 buffers",
        where, *r.buffer_count, r.trainer));
}

// Sets `field` of a role to `wanted` unless the deploy file set it; a second request for
// another value (from another trainer) is an error naming both.
template <class T>
void take(std::optional<T>& field, const std::optional<T>& wanted, bool set_by_file,
          std::map<std::string, std::string>& first_by, const std::string& what,
          const RoleSpec& role, const TierRequest& r) {
  if (!wanted || set_by_file) return;
  const auto [it, fresh] = first_by.emplace(what, r.trainer);
  if (!fresh && field != wanted)
    throw DeployConfigError(fmt::format(
        "offload role \"{}\" serves trainers \"{}\" and \"{}\", whose ds_configs ask for "
        "different {}; give the role its own setting in the deploy file or make the configs "
        "agree",
        role.name, it->second, r.trainer, what));
  field = wanted;
}

}  // namespace

std::vector<std::string> apply_tier_requests(DeployConfig& config,
                                             const std::vector<TierRequest>& requests) {
  // What the deploy file itself set, before any request fills a value in.
  std::map<std::string, RoleSpec> as_written;
  for (const auto& role : config.roles) as_written.emplace(role.name, role);
  std::map<std::string, std::map<std::string, std::string>> first_by;  // role -> what -> trainer
  std::vector<std::string> notes;
  for (const auto& r : requests) {
    check_request(r);
    const RoleSpec* trainer = config.find(r.trainer);
    if (!trainer) continue;
    for (const auto& name : trainer->offload) {
      auto it = std::find_if(config.roles.begin(), config.roles.end(),
                             [&](const RoleSpec& s) { return s.name == name; });
      if (it == config.roles.end()) continue;
      RoleSpec& role = *it;
      const RoleSpec& file = as_written.at(name);
      auto& firsts = first_by[name];
      if (file.nvme && *file.nvme != r.nvme_dir)
        notes.push_back(fmt::format(
            "offload role \"{}\" keeps its NVMe tier in {} as the deploy file says; trainer "
            "\"{}\"'s {} ({}) names {}",
            name, file.nvme->string(), r.trainer, r.nvme_key, r.config.string(),
            r.nvme_dir.string()));
      std::optional<std::filesystem::path> dir = r.nvme_dir;
      take(role.nvme, dir, file.nvme.has_value(), firsts, "NVMe directories", role, r);
      take(role.aio.block_size, r.aio.block_size, file.aio.block_size.has_value(), firsts,
           "aio.block_size", role, r);
      take(role.aio.queue_depth, r.aio.queue_depth, file.aio.queue_depth.has_value(), firsts,
           "aio.queue_depth", role, r);
      take(role.aio.single_submit, r.aio.single_submit, file.aio.single_submit.has_value(), firsts,
           "aio.single_submit", role, r);
      take(role.aio.overlap_events, r.aio.overlap_events, file.aio.overlap_events.has_value(),
           firsts, "aio.overlap_events", role, r);
      take(role.buffer_count, r.buffer_count, file.buffer_count.has_value(), firsts,
           "buffer counts", role, r);
    }
  }
  return notes;
}

}  // namespace dsactor::deploy
