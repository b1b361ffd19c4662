// `dsactor status`: a running deployment's figures, read from the dashboard `dsactor up`
// serves (/api/deployment), as a terminal table that refreshes or one JSON document.
#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/up_dashboard.h"
#include "deploy/deploy_config.h"
#include "metrics/state_figures.h"

namespace dsactor::cli {

namespace {

using nlohmann::json;

struct StatusArgs {
  std::string deploy;
  std::string endpoint;
  std::string token;
  bool json = false;
  bool once = false;
  double every = 1;
};

constexpr int kExitUnreachable = 4;

// The dashboard's base URL: --endpoint as given, or the deploy file's dashboard_listen
// (which must name its port: a free one is known only to the `up` that picked it).
std::string dashboard_base(const StatusArgs& a) {
  if (!a.endpoint.empty()) {
    std::string url = a.endpoint;
    if (const auto q = url.find('?'); q != std::string::npos) url.resize(q);
    while (!url.empty() && url.back() == '/') url.pop_back();
    return url.find("://") == std::string::npos ? "http://" + url : url;
  }
  const auto cfg = deploy::load_deploy_config(a.deploy);
  if (cfg.dashboard_listen.empty())
    throw std::invalid_argument(
        fmt::format("{}: dashboard_listen is none: this deployment serves no dashboard to read",
                    cfg.source.string()));
  auto at = metrics::parse_listen_address(cfg.dashboard_listen, "dashboard_listen");
  if (at.port == 0)
    throw std::invalid_argument(fmt::format(
        "{}: dashboard_listen {} picks a free port, which only `dsactor up` knows; pass "
        "--endpoint with the URL it printed, or give dashboard_listen a port",
        cfg.source.string(), cfg.dashboard_listen));
  if (at.host == "0.0.0.0") at.host = "127.0.0.1";
  if (at.host == "::") at.host = "::1";
  return at.host.find(':') != std::string::npos ? fmt::format("http://[{}]:{}", at.host, at.port)
                                                : fmt::format("http://{}:{}", at.host, at.port);
}

// The token: --token, else DSACTOR_METRICS_TOKEN, else the ?token= of --endpoint.
std::string token_of(const StatusArgs& a) {
  if (!a.token.empty()) return a.token;
  if (const char* env = std::getenv(kMetricsTokenEnv)) return env;
  const auto at = a.endpoint.find("token=");
  return at == std::string::npos ? "" : a.endpoint.substr(at + 6);
}

json fetch_deployment(const std::string& base, const std::string& token) {
  httplib::Client client(base);
  client.set_connection_timeout(std::chrono::seconds(2));
  client.set_read_timeout(std::chrono::seconds(5));
  httplib::Headers headers;
  if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
  auto res = client.Get("/api/deployment", headers);
  if (!res)
    throw std::runtime_error(
        fmt::format("no dashboard answers at {} ({}); is `dsactor up` running?", base,
                    httplib::to_string(res.error())));
  if (res->status == 401)
    throw std::runtime_error(
        fmt::format("{} wants the metrics token: --token, or {} (dsactor up printed it)", base,
                    kMetricsTokenEnv));
  if (res->status != 200)
    throw std::runtime_error(fmt::format("{}/api/deployment answered HTTP {}", base, res->status));
  return json::parse(res->body);
}

std::string num(std::optional<double> v, const char* spec = "{:.4g}") {
  return v ? fmt::format(fmt::runtime(spec), *v) : "-";
}

std::string gib(double bytes) {
  return fmt::format("{:.2f}G", bytes / (1024.0 * 1024 * 1024));
}

std::string trainer_rows(const json& roles) {
  std::string out = fmt::format(
      "{:<12} {:<5} {:>7} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}\n", "TRAINER",
      "UP", "STEP", "LOSS", "LR", "TOK/S", "FETCH", "FWD", "REDUCE", "PUSH", "BWD", "COMMIT",
      "OPT");
  for (const auto& r : roles) {
    if (r["kind"] != "trainer") continue;
    const json& s = r["state"];
    auto phase = [&](const char* p) {
      return num(metrics::value_of(s, "dsactor_train_last_phase_seconds", {{"phase", p}}),
                 "{:.3f}");
    };
    out += fmt::format(
        "{:<12} {:<5} {:>7} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}\n",
        r["name"].get<std::string>(), r["up"].get<bool>() ? "yes" : "no",
        num(metrics::value_of(s, "dsactor_train_global_step"), "{:.0f}"),
        num(metrics::value_of(s, "dsactor_train_loss")),
        num(metrics::value_of(s, "dsactor_train_lr"), "{:.3g}"),
        num(metrics::value_of(s, "dsactor_train_tokens_per_second"), "{:.0f}"), phase("fetch"),
        phase("forward"), phase("reduce"), phase("push"), phase("backward"), phase("commit"),
        phase("optimizer"));
  }
  return out;
}

std::string service_rows(const json& roles) {
  std::string out = fmt::format("{:<12} {:<5} {:>17} {:>9} {:>12} {:>12} {:>9}\n", "SERVICE", "UP",
                                "RAM/LIMIT", "NVME", "PUSH FRAMES", "PUSH ARENA", "REQUESTS");
  for (const auto& r : roles) {
    if (r["kind"] != "offload") continue;
    const json& s = r["state"];
    out += fmt::format(
        "{:<12} {:<5} {:>17} {:>9} {:>12} {:>12} {:>9}\n", r["name"].get<std::string>(),
        r["up"].get<bool>() ? "yes" : "no",
        gib(metrics::sum_of(s, "dsactor_offload_ram_bytes")) + "/" +
            gib(metrics::sum_of(s, "dsactor_offload_ram_limit_bytes")),
        gib(metrics::sum_of(s, "dsactor_offload_nvme_bytes")),
        gib(metrics::sum_of(s, "dsactor_offload_pushed_bytes_total", {{"path", "frames"}})),
        gib(metrics::sum_of(s, "dsactor_offload_pushed_bytes_total", {{"path", "arena"}})),
        num(metrics::value_of(s, "dsactor_offload_requests_total"), "{:.0f}"));
  }
  return out;
}

// A link rate in decimal units, GB/s at the top, as network and disk rates are quoted.
std::string rate_text(const json& bytes_per_second) {
  if (!bytes_per_second.is_number()) return "-";
  const double v = bytes_per_second.get<double>();
  if (v >= 1e9) return fmt::format("{:.2f} GB/s", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f} MB/s", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f} kB/s", v / 1e3);
  return fmt::format("{:.0f} B/s", v);
}

// Every role's link rates as the dashboard computes them (over its last polls): pushes,
// fetches and collectives of trainers, a service's pushes and NVMe reads and writes.
std::string link_rows(const json& roles) {
  std::string out = fmt::format("{:<12} {:<26} {:>12}\n", "LINKS", "LINK", "RATE");
  for (const auto& r : roles)
    for (const auto& l : r.value("links", json::array()))
      out += fmt::format("{:<12} {:<26} {:>12}\n", r["name"].get<std::string>(),
                         l["link"].get<std::string>(), rate_text(l["bytes_per_second"]));
  return out;
}

// Every rendezvous store of the deployment: a coordinator role's, or the one a rank-0
// trainer hosts (--serve-coordinator); "" when no role holds one.
std::string rendezvous_rows(const json& roles) {
  std::string out;
  for (const auto& r : roles) {
    const json& s = r["state"];
    if (!metrics::value_of(s, "dsactor_rendezvous_keys")) continue;
    if (out.empty())
      out = fmt::format("{:<12} {:<12} {:>6} {:>6} {:>7} {:>9} {:>8}\n", "RENDEZVOUS", "HOST",
                        "JOBS", "KEYS", "PARKED", "BYTES", "REFUSED");
    out += fmt::format(
        "{:<12} {:<12} {:>6} {:>6} {:>7} {:>9} {:>8}\n", "store", r["name"].get<std::string>(),
        num(metrics::value_of(s, "dsactor_rendezvous_jobs"), "{:.0f}"),
        num(metrics::value_of(s, "dsactor_rendezvous_keys"), "{:.0f}"),
        num(metrics::value_of(s, "dsactor_rendezvous_parked_requests"), "{:.0f}"),
        num(metrics::value_of(s, "dsactor_rendezvous_bytes"), "{:.0f}"),
        num(metrics::value_of(s, "dsactor_rendezvous_refused_requests_total"), "{:.0f}"));
  }
  return out;
}

std::string status_table(const json& d) {
  std::string out =
      fmt::format("job {}: {} role(s)\n\n", d["job"].get<std::string>(), d["roles"].size());
  out += trainer_rows(d["roles"]) + "\n" + service_rows(d["roles"]) + "\n" + link_rows(d["roles"]);
  if (const std::string stores = rendezvous_rows(d["roles"]); !stores.empty()) out += "\n" + stores;
  for (const auto& r : d["roles"])
    if (!r["up"].get<bool>())
      out += fmt::format("\n{} ({}): {}", r["name"].get<std::string>(),
                         r["kind"].get<std::string>(), r["error"].get<std::string>());
  return out + "\n";
}

void run_status(const StatusArgs& a) {
  if (a.deploy.empty() == a.endpoint.empty())
    throw CLI::ValidationError("dsactor status", "give one of --deploy FILE or --endpoint URL");
  const std::string base = dashboard_base(a), token = token_of(a);
  const bool refresh = !a.json && !a.once && ::isatty(STDOUT_FILENO);
  for (;;) {
    json d;
    try {
      d = fetch_deployment(base, token);
    } catch (const std::exception& e) {
      spdlog::error("dsactor status: {}", e.what());
      throw CLI::RuntimeError(kExitUnreachable);
    }
    if (a.json) {
      std::printf("%s\n", d.dump(2).c_str());
      return;
    }
    // Home and clear: the table redrawn in place, as `top` does.
    std::printf("%s%s", refresh ? "\033[H\033[2J" : "", status_table(d).c_str());
    std::fflush(stdout);
    if (!refresh) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(a.every));
  }
}

}  // namespace

void add_status_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "status",
      "a running deployment's figures (trainers' steps, loss, phase times; services' RAM, NVMe, "
      "pushed bytes) from the dashboard `dsactor up` serves: a table that refreshes on a "
      "terminal, or --json once");
  auto a = std::make_shared<StatusArgs>();
  cmd->add_option("--deploy", a->deploy,
                  "the deployment file (its dashboard_listen must name a port)");
  cmd->add_option("--endpoint", a->endpoint,
                  "the dashboard URL `dsactor up` printed (http://HOST:PORT[/?token=T])");
  cmd->add_option("--token", a->token, "the metrics token (default: DSACTOR_METRICS_TOKEN)");
  cmd->add_flag("--json", a->json, "print the deployment's figures as one JSON document, once");
  cmd->add_flag("--once", a->once, "print the table once, also on a terminal");
  cmd->add_option("--every", a->every, "seconds between refreshes")->check(CLI::PositiveNumber);
  cmd->footer("Exit codes: 0 shown; 4 no dashboard answered (or it refused the token).");
  cmd->callback([a] { run_status(*a); });
}

}  // namespace dsactor::cli
