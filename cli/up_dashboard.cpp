#include "cli/up_dashboard.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <set>
#include <stdexcept>

#include "actors/collectives/job_token.h"
#include "deploy/free_port.h"

namespace dsactor::cli {

namespace {

// Where the dashboard reads a role: its metrics address, a wildcard host read on loopback.
std::string role_url(const deploy::RoleSpec& r) {
  if (r.metrics_listen.empty()) return "";
  const auto at = metrics::parse_listen_address(r.metrics_listen, r.name + ".metrics_listen");
  std::string host = at.host;
  if (host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  return host.find(':') != std::string::npos ? fmt::format("http://[{}]:{}", host, at.port)
                                             : fmt::format("http://{}:{}", host, at.port);
}

}  // namespace

std::string prepare_role_metrics(deploy::DeployConfig& cfg) {
  bool off_loopback = false;
  if (!cfg.dashboard_listen.empty()) {
    const auto dashboard_at =
        metrics::parse_listen_address(cfg.dashboard_listen, "dashboard_listen");
    off_loopback = !metrics::is_loopback(dashboard_at.host);
    // A role that names a port binds it only when it starts, after these picks: a pick
    // must not be one of them (the kernel calls it free until then).
    std::set<int> taken = deploy::named_ports(cfg);
    const auto with_port = [&](const std::string& host) {
      const int port = deploy::pick_free_port(taken);
      return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                                 : fmt::format("{}:{}", host, port);
    };
    for (auto& r : cfg.roles) {
      if (r.metrics_listen.empty()) {
        r.metrics_listen = with_port("127.0.0.1");
        continue;
      }
      auto at = metrics::parse_listen_address(r.metrics_listen, r.name + ".metrics_listen");
      if (at.port == 0) r.metrics_listen = with_port(at.host);
    }
    // The dashboard binds before the roles start; left to port 0 it could be given a port
    // just picked for a role's metrics.
    if (dashboard_at.port == 0) cfg.dashboard_listen = with_port(dashboard_at.host);
  }
  for (const auto& r : cfg.roles)
    if (!r.metrics_listen.empty() &&
        !metrics::is_loopback(
            metrics::parse_listen_address(r.metrics_listen, r.name + ".metrics_listen").host))
      off_loopback = true;
  // A random secret of the same form as the job token; only what it protects differs.
  return off_loopback ? actors::generate_job_token() : "";
}

void pass_metrics_token(std::vector<deploy::ChildSpec>& children, const std::string& token) {
  if (token.empty()) return;
  for (auto& c : children) c.env.emplace_back(kMetricsTokenEnv, token);
}

std::unique_ptr<metrics::Dashboard> start_dashboard(const deploy::DeployConfig& cfg,
                                                    const std::string& token) {
  if (cfg.dashboard_listen.empty()) return nullptr;
  metrics::DashboardOptions o;
  o.server.listen = metrics::parse_listen_address(cfg.dashboard_listen, "dashboard_listen");
  o.server.token = token;
  o.server.what = cfg.source.string() + ": dashboard_listen";
  o.job = cfg.job;
  o.role_token = token;
  for (const auto& r : cfg.roles)
    o.roles.push_back({r.name, std::string(deploy::role_kind_name(r.kind)), role_url(r)});
  auto dashboard = std::make_unique<metrics::Dashboard>(std::move(o));
  // On stdout as well as the log: the line a user (or a script) looks for first.
  std::printf("dsactor up: dashboard %s%s\n", dashboard->url().c_str(),
              token.empty() ? "" : " (the token is part of the URL; keep it private)");
  std::fflush(stdout);
  return dashboard;
}

}  // namespace dsactor::cli
