#include "metrics/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace dsactor::metrics {

ListenAddress parse_listen_address(std::string_view text, std::string_view what) {
  auto fail = [&](std::string_view why) {
    return std::invalid_argument(fmt::format(
        "{} \"{}\": {} (expected HOST:PORT, e.g. 127.0.0.1:9100, [::1]:9100, or port 0 for a "
        "free port)",
        what, text, why));
  };
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) throw fail("no HOST:PORT");
  std::string_view host = text.substr(0, colon);
  const std::string_view port = text.substr(colon + 1);
  if (host.front() == '[') {
    if (host.back() != ']' || host.size() < 3) throw fail("unbalanced [ ] around the host");
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    throw fail("an IPv6 host goes in brackets");
  }
  ListenAddress a;
  a.host = std::string(host);
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535)
    throw fail("the port is not a number 0..65535");
  a.port = static_cast<uint16_t>(value);
  return a;
}

bool is_loopback(std::string_view host) {
  return host == "localhost" || host == "::1" || host.substr(0, 4) == "127.";
}

struct MetricsServer::Impl {
  httplib::Server server;
  std::thread thread;
};

namespace {

bool authorized(const httplib::Request& req, const std::string& token) {
  if (token.empty()) return true;
  if (req.get_header_value("Authorization") == "Bearer " + token) return true;
  return req.has_param("token") && req.get_param_value("token") == token;
}

}  // namespace

MetricsServer::MetricsServer(Registry& registry, ServerOptions options,
                             std::function<nlohmann::json()> state)
    : impl_(std::make_unique<Impl>()), options_(std::move(options)) {
  const ListenAddress& at = options_.listen;
  if (!is_loopback(at.host) && options_.token.empty())
    throw std::invalid_argument(
        fmt::format("{} {}:{}: off loopback the metrics need a token (--metrics-token, deploy key "
                    "metrics.token), or bind 127.0.0.1",
                    options_.what, at.host, at.port));
  auto& server = impl_->server;
  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, which would let a second
  // process bind the same port and take half of the scrapes instead of failing.
  server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const std::string token = options_.token;
  server.Get("/metrics", [&registry, token](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, token)) {
      res.status = 401;
      return;
    }
    res.set_content(registry.exposition(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server.Get("/api/state", [&registry, token, state = std::move(state)](const httplib::Request& req,
                                                                        httplib::Response& res) {
    if (!authorized(req, token)) {
      res.status = 401;
      return;
    }
    nlohmann::json body = registry.snapshot();
    body["process"] = state ? state() : nlohmann::json::object();
    // Error texts may hold bytes a peer sent, or a character cut at their bound: replaced,
    // never a refusal to serve the state.
    res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
  });
  const int port = at.port == 0 ? server.bind_to_any_port(at.host)
                                : (server.bind_to_port(at.host, at.port) ? at.port : -1);
  if (port <= 0)
    throw std::runtime_error(fmt::format("{} {}:{}: cannot bind (in use, or no such address)",
                                         options_.what, at.host, at.port));
  port_ = static_cast<uint16_t>(port);
  impl_->thread = std::thread([this] { impl_->server.listen_after_bind(); });
  // cpp-httplib's stop() does nothing before the accept loop runs (the loop would then
  // never end), so the server counts as started only once it does; the socket already
  // listens, so no request is lost meanwhile.
  while (!impl_->server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

MetricsServer::~MetricsServer() {
  stop();
}

std::string MetricsServer::url() const {
  const std::string& host = options_.listen.host;
  return host.find(':') != std::string::npos ? fmt::format("http://[{}]:{}", host, port_)
                                             : fmt::format("http://{}:{}", host, port_);
}

void MetricsServer::stop() {
  if (!impl_->thread.joinable()) return;
  impl_->server.stop();
  impl_->thread.join();
}

}  // namespace dsactor::metrics
