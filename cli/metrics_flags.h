#pragma once
// `--metrics-listen HOST:PORT` and `--metrics-token` of the commands that run a role
// (train, start --role trainer|offload): the process serves /metrics and /api/state
// (metrics/http_server.h) while it runs.
#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "metrics/http_server.h"

namespace dsactor::cli {

struct MetricsArgs {
  std::string listen;  // empty: no metrics server
  std::string token;   // required off loopback
};

// `scope` prefixes the help text ("trainer, offload: ").
void add_metrics_options(CLI::App& cmd, MetricsArgs& a, const std::string& scope = "");
// The server, started and its URL logged under `name`; null without --metrics-listen.
// Throws std::invalid_argument for a bad address, or one off loopback without a token.
std::unique_ptr<metrics::MetricsServer> serve_metrics(const MetricsArgs& a,
                                                      metrics::Registry& registry,
                                                      const std::string& name,
                                                      std::function<nlohmann::json()> state = {});

}  // namespace dsactor::cli
