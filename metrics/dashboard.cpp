#include "metrics/dashboard.h"

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "metrics/dashboard_assets.h"
#include "metrics/link_rates.h"
#include "metrics/state_figures.h"

namespace dsactor::metrics {

namespace {

using nlohmann::json;

struct RoleView {
  RoleView(DashboardRole r, std::chrono::milliseconds rate_window)
      : role(std::move(r)), rates(role.kind, rate_window) {}
  DashboardRole role;
  LinkRates rates;
  bool up = false;
  std::string error;
  json state = json::object();
  std::deque<json> history;
  double last_step = -1;
};

// The role's /api/state, or why not.
json fetch_state(const DashboardRole& role, const std::string& token, std::string& error) {
  httplib::Client client(role.url);
  client.set_connection_timeout(std::chrono::seconds(1));
  client.set_read_timeout(std::chrono::seconds(2));
  httplib::Headers headers;
  if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
  auto res = client.Get("/api/state", headers);
  if (!res) {
    error = "no answer from " + role.url + " (" + httplib::to_string(res.error()) + ")";
    return nullptr;
  }
  if (res->status != 200) {
    error = fmt::format("{}/api/state answered HTTP {}", role.url, res->status);
    return nullptr;
  }
  try {
    return json::parse(res->body);
  } catch (const json::exception& e) {
    error = fmt::format("{}/api/state is not JSON: {}", role.url, e.what());
    return nullptr;
  }
}

// A trainer's step as the timeline and charts keep it, once per new global step.
json step_record(const json& state) {
  json phases = json::object();
  for (const auto& [phase, seconds] :
       label_values(state, "dsactor_train_last_phase_seconds", "phase"))
    phases[phase] = seconds;
  return json{{"step", value_of(state, "dsactor_train_global_step").value_or(0)},
              {"loss", value_of(state, "dsactor_train_loss").value_or(0)},
              {"lr", value_of(state, "dsactor_train_lr").value_or(0)},
              {"tokens_per_second", value_of(state, "dsactor_train_tokens_per_second").value_or(0)},
              {"phases", phases}};
}

bool authorized(const httplib::Request& req, const std::string& token) {
  if (token.empty()) return true;
  if (req.get_header_value("Authorization") == "Bearer " + token) return true;
  return req.has_param("token") && req.get_param_value("token") == token;
}

}  // namespace

struct Dashboard::Impl {
  DashboardOptions options;
  httplib::Server server;
  uint16_t port = 0;
  std::thread serving, polling;
  mutable std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::vector<RoleView> views;
  int64_t updated_unix_ms = 0;

  void poll_once();
  void poll_loop();
  json deployment() const;
  void route();
};

void Dashboard::Impl::poll_once() {
  for (size_t i = 0; i < views.size(); ++i) {
    const DashboardRole role = views[i].role;
    if (role.url.empty()) continue;
    std::string error;
    json state = fetch_state(role, options.role_token, error);
    const auto read_at = std::chrono::steady_clock::now();
    std::lock_guard lock(mutex);
    RoleView& v = views[i];
    v.up = !state.is_null();
    v.error = error;
    if (!v.up) continue;
    v.state = std::move(state);
    v.rates.add(read_at, v.state);
    // A step once the trainer has reported one (its gauges read 0 before that).
    const auto step = value_of(v.state, "dsactor_train_global_step");
    if (step && *step != v.last_step && value_of(v.state, "dsactor_train_steps_total") > 0) {
      v.last_step = *step;
      v.history.push_back(step_record(v.state));
      if (v.history.size() > options.history_steps) v.history.pop_front();
    }
  }
  std::lock_guard lock(mutex);
  updated_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
}

void Dashboard::Impl::poll_loop() {
  std::unique_lock lock(mutex);
  while (!stopping) {
    lock.unlock();
    poll_once();
    lock.lock();
    wake.wait_for(lock, options.poll_every, [this] { return stopping; });
  }
}

json Dashboard::Impl::deployment() const {
  std::lock_guard lock(mutex);
  json roles = json::array();
  for (const auto& v : views) {
    json history = json::array();
    for (const auto& h : v.history) history.push_back(h);
    roles.push_back(json{{"name", v.role.name},
                         {"kind", v.role.kind},
                         {"url", v.role.url},
                         {"up", v.up},
                         {"error", v.role.url.empty() ? "serves no metrics" : v.error},
                         {"state", v.state},
                         {"links", v.rates.rates()},
                         {"history", std::move(history)}});
  }
  return json{{"job", options.job}, {"updated_unix_ms", updated_unix_ms}, {"roles", roles}};
}

void Dashboard::Impl::route() {
  const std::string token = options.server.token;
  auto guarded = [token](auto handler) {
    return [token, handler](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, token)) {
        res.status = 401;
        res.set_content("this dashboard needs its token: ?token=T (dsactor up printed it)",
                        "text/plain");
        return;
      }
      handler(req, res);
    };
  };
  server.Get("/", guarded([this, token](const httplib::Request&, httplib::Response& res) {
               res.set_content(render_dashboard_html(deployment(), token),
                               "text/html; charset=utf-8");
             }));
  server.Get("/api/deployment", guarded([this](const httplib::Request&, httplib::Response& res) {
               res.set_header("Cache-Control", "no-store");
               // The roles' states carry their error texts: invalid UTF-8 is replaced.
               res.set_content(
                   deployment().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                   "application/json");
             }));
  server.Get(R"(/assets/([a-z_.]+))",
             guarded([](const httplib::Request& req, httplib::Response& res) {
               const Asset* a = find_dashboard_asset(req.matches[1].str());
               if (!a) {
                 res.status = 404;
                 return;
               }
               res.set_content(std::string(a->body), std::string(a->content_type));
             }));
}

Dashboard::Dashboard(DashboardOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  for (const auto& r : m.options.roles) m.views.emplace_back(r, m.options.rate_window);
  const ListenAddress& at = m.options.server.listen;
  if (!is_loopback(at.host) && m.options.server.token.empty())
    throw std::invalid_argument(
        fmt::format("{} {}:{}: off loopback the dashboard needs a token, or bind 127.0.0.1",
                    m.options.server.what, at.host, at.port));
  m.server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  m.route();
  const int port = at.port == 0 ? m.server.bind_to_any_port(at.host)
                                : (m.server.bind_to_port(at.host, at.port) ? at.port : -1);
  if (port <= 0)
    throw std::runtime_error(fmt::format("{} {}:{}: cannot bind (in use, or no such address)",
                                         m.options.server.what, at.host, at.port));
  m.port = static_cast<uint16_t>(port);
  m.serving = std::thread([&m] { m.server.listen_after_bind(); });
  // As in MetricsServer: stop() is lost on a server whose accept loop has not started.
  while (!m.server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  m.polling = std::thread([&m] { m.poll_loop(); });
}

Dashboard::~Dashboard() {
  stop();
}

uint16_t Dashboard::port() const {
  return impl_->port;
}

std::string Dashboard::url() const {
  const std::string& host = impl_->options.server.listen.host;
  const std::string base = host.find(':') != std::string::npos
                               ? fmt::format("http://[{}]:{}/", host, impl_->port)
                               : fmt::format("http://{}:{}/", host, impl_->port);
  const std::string& token = impl_->options.server.token;
  return token.empty() ? base : base + "?token=" + token;
}

nlohmann::json Dashboard::deployment() const {
  return impl_->deployment();
}

void Dashboard::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mutex);
    if (m.stopping) return;
    m.stopping = true;
  }
  m.wake.notify_all();
  if (m.polling.joinable()) m.polling.join();
  m.server.stop();
  if (m.serving.joinable()) m.serving.join();
}

}  // namespace dsactor::metrics
