#pragma once
// Ports `dsactor up` chooses for what the deployment leaves open (a role's metrics port, the
// dashboard's port 0): free now, and none that the deployment itself names, since a role
// that names a port may not have bound it yet when another role's pick is made.
#include <functional>
#include <set>

#include "deploy/deploy_config.h"

namespace dsactor::deploy {

// Every TCP port the deployment names: the roles' `listen`, the rendezvous, a role's
// `metrics_listen` and `dashboard_listen` (port 0 names none).
std::set<int> named_ports(const DeployConfig& cfg);

// A port the kernel hands out for 127.0.0.1 now (bound to port 0, then closed).
int kernel_free_loopback_port();

// A port `probe` calls free that `avoid` does not hold; it is added to `avoid`, so picks
// from one set never repeat. Throws std::runtime_error when 64 probes in a row give only
// avoided ports.
int pick_free_port(std::set<int>& avoid,
                   const std::function<int()>& probe = kernel_free_loopback_port);

}  // namespace dsactor::deploy
