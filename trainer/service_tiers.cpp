#include "trainer/service_tiers.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <stdexcept>

#include "actors/offload_link/offload_client.h"

namespace dsactor::trainer {

namespace {

// The config key that asks for NVMe, and its nvme_path; empty when none does.
std::pair<std::string, std::string> nvme_request(const ZeroConfig& z) {
  if (z.offload_optimizer.device == OffloadDevice::kNvme)
    return {"zero_optimization.offload_optimizer.device", z.offload_optimizer.nvme_path};
  if (z.offload_param.device == OffloadDevice::kNvme)
    return {"zero_optimization.offload_param.device", z.offload_param.nvme_path};
  return {};
}

messages::StatsReply stats_of(const std::string& endpoint, const security::ClientSecurity& security,
                              std::chrono::milliseconds timeout) {
  try {
    actors::OffloadClient client(endpoint, security, timeout, "tier-check");
    return client.stats();
  } catch (const std::exception& e) {
    throw std::runtime_error(
        fmt::format("offload service {} did not answer a Stats request: {}", endpoint, e.what()));
  }
}

}  // namespace

void check_service_tiers(const DsConfig& config, const std::vector<std::string>& endpoints,
                         const std::vector<security::ClientSecurity>& security,
                         std::chrono::milliseconds timeout) {
  const auto [key, nvme_path] = nvme_request(config.zero_optimization);
  if (key.empty()) return;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    const std::string& endpoint = endpoints[i];
    const messages::StatsReply s = stats_of(endpoint, security.at(i), timeout);
    if (s.nvme_tier == messages::NvmeTier::kUnknown) {
      spdlog::warn(
          "{}: {} is \"nvme\", and offload service {} is too old to say whether it has "
          "an NVMe tier; going on",
          config.source, key, endpoint);
    } else if (s.nvme_tier == messages::NvmeTier::kAbsent) {
      throw ConfigError(fmt::format(
          "{}: {} is \"nvme\" (nvme_path {}), but offload service {} has no NVMe tier (it was "
          "started without --nvme), so the state would live in its RAM: start it with --nvme "
          "DIR (`dsactor up` does that from nvme_path), or set the device to \"cpu\"",
          config.source, key, nvme_path, endpoint));
    } else if (s.nvme_dir != nvme_path) {
      spdlog::info("{}: offload service {} keeps its NVMe tier in {} (nvme_path says {})",
                   config.source, endpoint, s.nvme_dir, nvme_path);
    }
  }
}

}  // namespace dsactor::trainer
