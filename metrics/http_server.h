#pragma once
// The HTTP side of a process's metrics (cpp-httplib, its own threads): GET /metrics in the
// Prometheus text format and GET /api/state as JSON. Read-only: nothing else is served.
// It binds loopback unless told otherwise; off loopback it refuses to start without a
// bearer token, which every request must then carry (`Authorization: Bearer TOKEN`, what
// Prometheus's `authorization` scrape setting sends, or `?token=TOKEN` for a browser).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "metrics/registry.h"

namespace dsactor::metrics {

struct ListenAddress {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: a free port, chosen when bound
};

// "HOST:PORT" ("[::1]:PORT" for IPv6); PORT 0 picks a free port. Throws
// std::invalid_argument naming `what` (the flag or key it came from) and the expected form.
ListenAddress parse_listen_address(std::string_view text, std::string_view what);
// 127.0.0.0/8, ::1 and "localhost".
bool is_loopback(std::string_view host);

struct ServerOptions {
  ListenAddress listen;
  // Required off loopback; when set, also required on loopback.
  std::string token;
  // Names the setting in errors (e.g. "--metrics-listen").
  std::string what = "metrics listen address";
};

class MetricsServer {
 public:
  // Binds and starts serving; throws std::invalid_argument for an address off loopback
  // without a token, std::runtime_error when the address cannot be bound. `state` adds
  // the process's own part to /api/state ("process"), beside the registry's snapshot.
  MetricsServer(Registry& registry, ServerOptions options,
                std::function<nlohmann::json()> state = {});
  // stop().
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  uint16_t port() const { return port_; }
  // http://HOST:PORT (IPv6 hosts in brackets).
  std::string url() const;
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ServerOptions options_;
  uint16_t port_ = 0;
};

}  // namespace dsactor::metrics
