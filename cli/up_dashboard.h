#pragma once
// The dashboard `dsactor up` serves for its deployment (metrics/dashboard.h): every
// trainer and offload role serves metrics on a port `up` knows, and the dashboard reads
// them all.
#include <memory>
#include <string>
#include <vector>

#include "deploy/deploy_config.h"
#include "deploy/supervisor.h"
#include "metrics/dashboard.h"

namespace dsactor::cli {

// The environment variable a role's --metrics-token defaults to: how `up` hands the
// run's metrics token to its children without putting it on their command lines.
inline constexpr const char* kMetricsTokenEnv = "DSACTOR_METRICS_TOKEN";

// With a dashboard: gives every role without metrics_listen a free
// loopback port, and a role whose metrics_listen says port 0 a chosen one (the dashboard
// must know where to read). Returns the run's metrics token: a fresh one when the
// dashboard or a role's metrics listen off loopback, else empty (loopback needs none).
std::string prepare_role_metrics(deploy::DeployConfig& cfg);
// Adds the token to every child's environment (kMetricsTokenEnv); nothing when empty.
void pass_metrics_token(std::vector<deploy::ChildSpec>& children, const std::string& token);
// The dashboard, serving, with its URL (and token) printed on stdout; null without
// dashboard_listen. Throws like metrics::Dashboard.
std::unique_ptr<metrics::Dashboard> start_dashboard(const deploy::DeployConfig& cfg,
                                                    const std::string& token);

}  // namespace dsactor::cli
