#pragma once
// What a ds_config's offload devices ask of the offload services a trainer is given:
// `device: nvme` needs services with an NVMe tier. `dsactor up` starts the services with
// the tier the config names (deploy/service_tiers.h); a service started by hand may lack it.
#include <chrono>
#include <string>
#include <vector>

#include "security/transport_security.h"
#include "trainer/config/ds_config.h"

namespace dsactor::trainer {

// Asks every service in `endpoints` for its Stats and throws ConfigError naming the config
// key, the endpoint and the fix when offload_optimizer or offload_param says "nvme" and a
// service has no NVMe tier. A service too old to say (no tier in its Stats) is logged and
// let through; one that does not answer throws std::runtime_error naming it. `security[i]`
// is how endpoints[i] is reached (ZeroOptions::service_security).
void check_service_tiers(const DsConfig& config, const std::vector<std::string>& endpoints,
                         const std::vector<security::ClientSecurity>& security,
                         std::chrono::milliseconds timeout);

}  // namespace dsactor::trainer
