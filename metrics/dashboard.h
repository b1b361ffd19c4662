#pragma once
// One page for a whole deployment: the dashboard polls every role's /api/state (the
// MetricsServer of each trainer and offload service), keeps the last steps each trainer
// reported, and serves
//   GET /                the page: every figure as server-rendered tables, so it reads
//                        without JavaScript, plus the script that draws the charts;
//   GET /api/deployment  the same as one JSON document (what the script and `dsactor
//                        status` read);
//   GET /assets/NAME     the page's script and style sheet, embedded in the binary.
// Read-only, like the roles' servers: loopback unless told otherwise, and off loopback
// only with a bearer token.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrics/http_server.h"

namespace dsactor::metrics {

// A process the dashboard reads: its metrics server's base URL (http://HOST:PORT), or
// none (a role that serves no metrics: it is listed, without figures).
struct DashboardRole {
  std::string name;
  std::string kind;  // offload, trainer, coordinator
  std::string url;
};

struct DashboardOptions {
  ServerOptions server;
  std::string job;
  std::vector<DashboardRole> roles;
  std::string role_token;  // what the roles' servers want (empty: none)
  std::chrono::milliseconds poll_every{500};
  size_t history_steps = 120;  // steps kept per trainer for the timeline and charts
  // Link rates are over this much of the last polls (metrics/link_rates.h): several steps,
  // so a counter a trainer moves once per step reads its mean, as a service's does.
  std::chrono::milliseconds rate_window{10000};
};

class Dashboard {
 public:
  // Binds (throws like MetricsServer) and starts polling the roles.
  explicit Dashboard(DashboardOptions options);
  ~Dashboard();
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // http://HOST:PORT/ (with ?token=T when there is one: what a user opens).
  std::string url() const;
  uint16_t port() const;
  // {"job", "updated_unix_ms", "roles": [{"name", "kind", "url", "up", "error", "state",
  //  "links", "history"}]}: `state` the role's last /api/state, `links` its link rates
  //  (LinkRates::rates()), `history` (trainers) its last steps
  //  [{"step", "loss", "lr", "tokens_per_second", "phases": {phase: seconds}}].
  nlohmann::json deployment() const;
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The page without JavaScript: every role's figures as HTML tables (exposed for tests).
std::string render_dashboard_html(const nlohmann::json& deployment, const std::string& token);
// `&`, `<`, `>`, `"` and `'` as HTML entities.
std::string html_escape(std::string_view text);

}  // namespace dsactor::metrics
