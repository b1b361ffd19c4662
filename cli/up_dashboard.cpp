#include "cli/up_dashboard.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>

#include "actors/collectives/job_token.h"

namespace dsactor::cli {

namespace {

// A port the kernel calls free on 127.0.0.1 now; the role binds it a moment later (the
// same window every "port 0, then tell the others" scheme has).
uint16_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("dsactor up: no socket to find a free metrics port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error("dsactor up: cannot find a free loopback port for metrics");
  return ntohs(addr.sin_port);
}

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
    off_loopback = !metrics::is_loopback(
        metrics::parse_listen_address(cfg.dashboard_listen, "dashboard_listen").host);
    for (auto& r : cfg.roles) {
      if (r.metrics_listen.empty()) {
        r.metrics_listen = fmt::format("127.0.0.1:{}", free_loopback_port());
        continue;
      }
      auto at = metrics::parse_listen_address(r.metrics_listen, r.name + ".metrics_listen");
      if (at.port == 0)
        r.metrics_listen = at.host.find(':') != std::string::npos
                               ? fmt::format("[{}]:{}", at.host, free_loopback_port())
                               : fmt::format("{}:{}", at.host, free_loopback_port());
    }
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
