// A tiny `dsactor up` deployment (an offload service and a ZeRO-3 trainer against it)
// watched three ways while it trains: `dsactor status --json`, a real Prometheus server
// scraping every role (Debian's prometheus), and the dashboard in a headless Chromium
// (Debian's chromium + chromium-driver, over WebDriver). Loss values are checked against the
// trainer's CSV monitor; the browser's screenshot is kept in the build folder.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "tests/cli/child_process.h"
#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"
#include "tests/metrics/tiny_offload_run.h"
#include "tests/metrics/webdriver.h"

namespace dsactor {
namespace {

using dsactor::testing::DsactorProcess;
using dsactor::testing::free_port;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;
using nlohmann::json;
using namespace std::chrono_literals;

// The CSV monitor's loss for `step`, as a number.
std::optional<double> csv_loss(const std::filesystem::path& dir, long step) {
  std::ifstream in(dir / "monitor" / "dash" / "Train_Samples_train_loss.csv");
  const std::string prefix = std::to_string(step) + ",";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) return std::stod(line.substr(prefix.size()));
  return std::nullopt;
}

class DashboardEndToEnd : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const auto& d = *dir_;
    dsactor::testing::write_tiny_offload_run(d.path(), "a dashboard shows what a run does", "dash");
    dashboard_port_ = free_port();
    write_file(d / "deploy.yaml",
               "job: dash\nsecurity: {insecure: true}\nenv: {XDG_STATE_HOME: \"" +
                   (d / "state").string() +
                   "\"}\ndashboard_listen: \"127.0.0.1:" + std::to_string(dashboard_port_) +
                   "\"\nroles:\n  - {role: offload, mlock: false, listen: \"tcp://127.0.0.1:" +
                   std::to_string(free_port()) +
                   "\"}\n  - {role: trainer, config: ds.json, model: tiny, data: corpus.txt, "
                   "steps: 100000, out: out}\n");
    up_ = new DsactorProcess({"up", (d / "deploy.yaml").string()}, d / "up.out", d / "up.err");
  }
  static void TearDownTestSuite() {
    up_->signal(SIGINT);
    up_->wait(60s);
    delete up_;
    delete dir_;
  }
  void SetUp() override {
    ASSERT_TRUE(up_->wait_for_out("dsactor up: dashboard http://127.0.0.1:", 60s))
        << up_->out() << up_->err();
  }

  // /api/deployment once every role is up and the trainer has run `steps` steps.
  static json deployment_after(double steps) {
    httplib::Client client("127.0.0.1", dashboard_port_);
    const auto deadline = std::chrono::steady_clock::now() + 300s;
    json d;
    while (std::chrono::steady_clock::now() < deadline) {
      if (auto res = client.Get("/api/deployment"); res && res->status == 200) {
        d = json::parse(res->body);
        bool all_up = true;
        double step = 0;
        for (const auto& r : d["roles"]) {
          all_up = all_up && r["up"].get<bool>();
          if (r["kind"] == "trainer" && !r["history"].empty())
            step = r["history"].back()["step"].get<double>();
        }
        if (all_up && step >= steps) return d;
      }
      std::this_thread::sleep_for(100ms);
    }
    ADD_FAILURE() << "the deployment did not reach step " << steps << ": " << d.dump(1) << "\n"
                  << up_->err();
    return d;
  }

  static inline TempDir* dir_ = nullptr;
  static inline DsactorProcess* up_ = nullptr;
  static inline int dashboard_port_ = 0;
};

TEST_F(DashboardEndToEnd, StatusJsonShowsEveryRoleAndTheTrainersSteps) {
  deployment_after(2);
  const auto r = testing::run_dsactor(
      "status --json --deploy '" + (*dir_ / "deploy.yaml").string() + "'", dir_->path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json d = json::parse(r.out);
  EXPECT_EQ(d["job"], "dash");
  ASSERT_EQ(d["roles"].size(), 2u) << r.out;
  EXPECT_EQ(d["roles"][0]["name"], "offload0");
  EXPECT_EQ(d["roles"][1]["name"], "trainer0");
  const json& trainer = d["roles"][1]["state"];
  EXPECT_GE(trainer["metrics"]["dsactor_train_global_step"]["series"][0]["value"].get<double>(), 2);
  EXPECT_TRUE(d["roles"][0]["state"]["metrics"].contains("dsactor_offload_pushed_bytes_total"));
  // The table form (stdout is not a terminal here: printed once).
  const auto table = testing::run_dsactor(
      "status --deploy '" + (*dir_ / "deploy.yaml").string() + "'", dir_->path());
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("trainer0"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("offload0"), std::string::npos) << table.out;
  // Nothing listening: a clear error and exit code 4.
  const auto none = testing::run_dsactor(
      "status --json --endpoint http://127.0.0.1:" + std::to_string(free_port()), dir_->path());
  EXPECT_EQ(none.exit_code, 4);
  EXPECT_NE(none.err.find("no dashboard answers"), std::string::npos) << none.err;
}

// The rate of `link` in a role's "links" (the dashboard's own figures), or none yet.
std::optional<double> link_rate(const json& role, const std::string& link) {
  for (const auto& l : role["links"])
    if (l["link"] == link && l["bytes_per_second"].is_number())
      return l["bytes_per_second"].get<double>();
  return std::nullopt;
}

// The trainer pushes through the service's arena (same host): the dashboard's rate of the
// trainer's pushes and of the service's pushed-in bytes are rates of the same bytes, so
// they agree (within what one step's bytes make over the window), although the trainer
// counts once per step and the service with every request.
TEST_F(DashboardEndToEnd, TheTrainersAndTheServicesPushRatesAgree) {
  deployment_after(2);
  std::this_thread::sleep_for(11s);  // a whole rate window of training
  json d;
  std::optional<double> pushed, received;
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (std::chrono::steady_clock::now() < deadline) {
    d = deployment_after(2);
    pushed = link_rate(d["roles"][1], "push to services");
    const auto frames = link_rate(d["roles"][0], "pushed in (frames)");
    const auto arena = link_rate(d["roles"][0], "pushed in (arena)");
    received = frames && arena ? std::optional(*frames + *arena) : std::nullopt;
    if (pushed && received && *pushed > 0 && *received > 0) break;
    std::this_thread::sleep_for(500ms);
  }
  ASSERT_TRUE(pushed && received && *pushed > 0 && *received > 0) << d.dump(1);
  EXPECT_GT(*received, *pushed / 2) << d["roles"][1]["links"] << d["roles"][0]["links"];
  EXPECT_LT(*received, *pushed * 2) << d["roles"][1]["links"] << d["roles"][0]["links"];
}

// "127.0.0.1:PORT" of every role's metrics server, from the dashboard's roles.
std::vector<std::string> scrape_targets(const json& d) {
  std::vector<std::string> targets;
  for (const auto& r : d["roles"])
    targets.push_back(std::regex_replace(r["url"].get<std::string>(), std::regex("^http://"), ""));
  return targets;
}

// Prometheus's instant query `q`: the result vector.
json prometheus_query(httplib::Client& client, const std::string& q) {
  auto res = client.Get("/api/v1/query", httplib::Params{{"query", q}}, httplib::Headers{});
  if (!res || res->status != 200) return json::array();
  return json::parse(res->body)["data"]["result"];
}

TEST_F(DashboardEndToEnd, PrometheusScrapesTheDeployment) {
  ASSERT_EQ(std::system("command -v prometheus >/dev/null 2>&1"), 0)
      << "no prometheus: run scripts/install-deps.sh (Debian's prometheus package)";
  const json d = deployment_after(1);
  std::string targets;
  for (const auto& t : scrape_targets(d)) {
    if (!targets.empty()) targets += ", ";
    targets += "'" + t + "'";
  }
  // honor_labels: the series' own job label (the deployment's job) wins over the scrape
  // job's name.
  write_file(*dir_ / "prometheus.yml",
             "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n"
             "  - job_name: dsactor\n    honor_labels: true\n    static_configs:\n"
             "      - targets: [" +
                 targets + "]\n");
  const int port = free_port();
  deploy::ChildOptions o;
  o.out = deploy::Output::to_file(*dir_ / "prometheus.log");
  o.err = deploy::Output::same_as_stdout();
  auto prometheus = deploy::ChildProcess::exec(
      {"/usr/bin/prometheus", "--config.file=" + (*dir_ / "prometheus.yml").string(),
       "--storage.tsdb.path=" + (*dir_ / "tsdb").string(),
       "--web.listen-address=127.0.0.1:" + std::to_string(port)},
      o);
  httplib::Client client("127.0.0.1", port);
  // Both series of one instant query come from one scrape (the same timestamp); a scrape
  // between the monitor's two writes shows a loss of the next step, so look again.
  const auto deadline = std::chrono::steady_clock::now() + 300s;
  bool matched = false;
  double pushed = 0;
  std::string last;
  while (!matched && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(500ms);
    const json r = prometheus_query(
        client, R"({__name__=~"dsactor_train_loss|dsactor_train_global_step",role="trainer"})");
    const json p = prometheus_query(client, "sum(dsactor_offload_pushed_bytes_total)");
    last = r.dump() + p.dump();
    if (r.size() != 2 || p.size() != 1) continue;
    std::optional<double> loss, step;
    for (const auto& s : r) {
      EXPECT_EQ(s["metric"]["job"], "dash");
      const double v = std::stod(s["value"][1].get<std::string>());
      (s["metric"]["__name__"] == "dsactor_train_loss" ? loss : step) = v;
    }
    pushed = std::stod(p[0]["value"][1].get<std::string>());
    const auto csv = csv_loss(dir_->path(), static_cast<long>(*step));
    matched = csv && *csv == *loss && pushed > 0;
  }
  EXPECT_TRUE(matched) << "no scrape whose loss equals the CSV monitor's row for its step: " << last
                       << "\n"
                       << testing::read_file(*dir_ / "prometheus.log");
  EXPECT_GT(pushed, 0);
}

TEST_F(DashboardEndToEnd, BrowserShowsEveryRoleAndActorAndTheLossChartGrows) {
  const std::string missing = testing::missing_browser();
  ASSERT_TRUE(missing.empty()) << missing;
  const json d = deployment_after(1);
  testing::HeadlessBrowser browser(*dir_ / "chromedriver.log");
  browser.open("http://127.0.0.1:" + std::to_string(dashboard_port_) + "/");
  const std::string probe = R"(
    const roles = [...document.querySelectorAll("section.role")].map((e) => e.dataset.role);
    const actors = [...document.querySelectorAll("section.role")].map((e) =>
      e.dataset.role + ":" + [...e.querySelectorAll(".actor")].map((a) => a.dataset.actor).join(","));
    const chart = document.getElementById("loss-chart");
    return {roles: roles, actors: actors, points: chart ? +chart.dataset.points : -1};)";
  // The actors every role lists in its /api/state, which the page must show.
  std::set<std::string> expected;
  for (const auto& r : d["roles"]) {
    std::string names;
    for (const auto& a : r["state"]["process"]["actors"]) {
      if (!names.empty()) names += ',';
      names += a.get<std::string>();
    }
    expected.insert(r["name"].get<std::string>() + ":" + names);
  }
  json first, later;
  const auto deadline = std::chrono::steady_clock::now() + 300s;
  while (std::chrono::steady_clock::now() < deadline) {
    const json v = browser.run(probe)["value"];
    if (first.is_null() && v["points"].get<int>() >= 1) first = v;
    if (!first.is_null() && v["points"].get<int>() > first["points"].get<int>()) {
      later = v;
      break;
    }
    std::this_thread::sleep_for(250ms);
  }
  ASSERT_FALSE(first.is_null()) << "the loss chart never showed a point";
  ASSERT_FALSE(later.is_null()) << "the loss chart stayed at " << first["points"] << " point(s)";
  EXPECT_EQ(later["roles"], json::array({"offload0", "trainer0"}));
  for (const auto& a : later["actors"]) EXPECT_TRUE(expected.count(a.get<std::string>())) << a;
  EXPECT_EQ(later["actors"].size(), expected.size());
  for (const auto& r : d["roles"])
    EXPECT_FALSE(r["state"]["process"]["actors"].empty()) << r["name"];
  const auto artifacts = std::filesystem::path(DSACTOR_BUILD_DIR) / "test-artifacts";
  std::filesystem::create_directories(artifacts);
  browser.screenshot(artifacts / "dashboard.png");
  EXPECT_GT(std::filesystem::file_size(artifacts / "dashboard.png"), 1000u);
}

}  // namespace
}  // namespace dsactor
