#include "cli/metrics_flags.h"

#include <spdlog/spdlog.h>

namespace dsactor::cli {

void add_metrics_options(CLI::App& cmd, MetricsArgs& a, const std::string& scope) {
  cmd.add_option("--metrics-listen", a.listen,
                 scope +
                     "serve Prometheus /metrics and JSON /api/state over HTTP at HOST:PORT "
                     "(port 0: a free one, logged); off loopback only with --metrics-token");
  cmd.add_option("--metrics-token", a.token,
                 scope +
                     "bearer token every metrics request must carry (Authorization: Bearer "
                     "TOKEN, or ?token=TOKEN); needed off loopback")
      ->envname("DSACTOR_METRICS_TOKEN");
}

std::unique_ptr<metrics::MetricsServer> serve_metrics(const MetricsArgs& a,
                                                      metrics::Registry& registry,
                                                      const std::string& name,
                                                      std::function<nlohmann::json()> state) {
  if (a.listen.empty()) {
    if (!a.token.empty())
      throw std::invalid_argument("--metrics-token without --metrics-listen: nothing to protect");
    return nullptr;
  }
  metrics::ServerOptions o;
  o.listen = metrics::parse_listen_address(a.listen, "--metrics-listen");
  o.token = a.token;
  o.what = "--metrics-listen";
  auto server = std::make_unique<metrics::MetricsServer>(registry, o, std::move(state));
  spdlog::info("{}: metrics on {}/metrics and {}/api/state{}", name, server->url(), server->url(),
               a.token.empty() ? "" : " (bearer token required)");
  return server;
}

}  // namespace dsactor::cli
