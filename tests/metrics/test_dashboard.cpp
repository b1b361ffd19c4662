// The deployment dashboard against real metrics servers on 127.0.0.1: it reads each
// role's /api/state, keeps a trainer's steps, serves the page (figures as tables without
// JavaScript), /api/deployment and its embedded assets, and holds to its token.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "metrics/dashboard.h"
#include "metrics/link_rates.h"
#include "metrics/state_figures.h"

namespace dsactor::metrics {
namespace {

using namespace std::chrono_literals;

ServerOptions loopback(std::string token = "") {
  ServerOptions o;
  o.listen.port = 0;
  o.token = std::move(token);
  o.what = "test";
  return o;
}

// Polls `dashboard` until `done(deployment)`, or 20 s.
template <class Pred>
nlohmann::json wait_for(const Dashboard& dashboard, Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  nlohmann::json d = dashboard.deployment();
  while (!done(d) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    d = dashboard.deployment();
  }
  return d;
}

TEST(Dashboard, ReadsEveryRoleKeepsStepsAndServesThePage) {
  Registry trainer(Labels{{"role", "trainer"}});
  auto& step = trainer.gauge("dsactor_train_global_step", "step");
  auto& loss = trainer.gauge("dsactor_train_loss", "loss");
  auto& steps = trainer.counter("dsactor_train_steps_total", "steps");
  trainer.gauge("dsactor_train_last_phase_seconds", "phases", {{"phase", "fetch"}}).set(0.25);
  trainer.gauge("dsactor_train_last_phase_seconds", "phases", {{"phase", "reduce"}}).set(0.125);
  trainer.counter("dsactor_actor_messages_total", "messages", {{"actor", "monitor"}}).add(3);
  trainer.set_text("dsactor_actor_last_error", {{"actor", "monitor"}}, "no <csv> file");
  trainer.counter("dsactor_train_pushed_bytes_total", "pushed").add(4096);
  MetricsServer trainer_server(trainer, loopback("secret-of-the-roles"));
  DashboardOptions o;
  o.server = loopback();
  o.job = "job<1>";
  o.role_token = "secret-of-the-roles";
  o.poll_every = 10ms;
  o.roles = {{"trainer0", "trainer", trainer_server.url()}, {"coordinator0", "coordinator", ""}};
  Dashboard dashboard(o);

  // Before the first step report the gauges read 0: no step is kept.
  wait_for(dashboard, [](const auto& d) { return d["roles"][0]["up"].template get<bool>(); });
  EXPECT_TRUE(dashboard.deployment()["roles"][0]["history"].empty());
  step.set(1);
  loss.set(4.5);
  steps.add();
  auto d = wait_for(dashboard, [](const auto& d) { return d["roles"][0]["history"].size() == 1; });
  step.set(2);
  loss.set(4.25);
  steps.add();
  d = wait_for(dashboard, [](const auto& d) { return d["roles"][0]["history"].size() == 2; });
  ASSERT_EQ(d["roles"][0]["history"].size(), 2u) << d.dump(1);
  EXPECT_TRUE(d["roles"][0]["up"].get<bool>());
  EXPECT_EQ(d["roles"][0]["history"][1]["loss"], 4.25);
  EXPECT_EQ(d["roles"][0]["history"][1]["phases"]["fetch"], 0.25);
  EXPECT_EQ(d["roles"][0]["history"][1]["phases"]["reduce"], 0.125);
  EXPECT_EQ(value_of(d["roles"][0]["state"], "dsactor_train_loss"), 4.25);
  EXPECT_FALSE(d["roles"][1]["up"].get<bool>());
  EXPECT_EQ(d["roles"][1]["error"], "serves no metrics");
  // The trainer's link rates, from the dashboard's own polls: a counter that stood still
  // reads 0 B/s, one the trainer does not have (fetched bytes) no rate at all.
  ASSERT_EQ(d["roles"][0]["links"].size(), 4u) << d.dump(1);
  EXPECT_EQ(d["roles"][0]["links"][0]["link"], "push to services");
  EXPECT_EQ(d["roles"][0]["links"][0]["bytes_per_second"], 0.0);
  EXPECT_TRUE(d["roles"][0]["links"][1]["bytes_per_second"].is_null());
  EXPECT_TRUE(d["roles"][1]["links"].empty());

  httplib::Client client("127.0.0.1", dashboard.port());
  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  // Without JavaScript: the roles, their actors and their figures are in the HTML itself.
  EXPECT_NE(page->body.find("data-role=\"trainer0\""), std::string::npos) << page->body;
  EXPECT_NE(page->body.find("data-actor=\"monitor\""), std::string::npos);
  EXPECT_NE(
      page->body.find("<span class=\"fig last-error\">last error: no &lt;csv&gt; file</span>"),
      std::string::npos);
  EXPECT_NE(page->body.find("<td>dsactor_train_loss</td><td></td><td class=\"num\">4.25</td>"),
            std::string::npos);
  EXPECT_NE(page->body.find("<td>dsactor_train_last_phase_seconds</td><td>phase=fetch</td>"),
            std::string::npos);
  EXPECT_NE(page->body.find("<td>dsactor_train_last_phase_seconds</td><td>phase=reduce</td>"
                            "<td class=\"num\">0.125</td>"),
            std::string::npos);
  EXPECT_NE(page->body.find("<tr><td>collectives (gradients)</td><td class=\"num\">&ndash;</td>"),
            std::string::npos);
  EXPECT_NE(page->body.find("<tr><td>push to services</td><td class=\"num\">0</td></tr>"),
            std::string::npos);
  EXPECT_NE(page->body.find("job&lt;1&gt;"), std::string::npos);
  EXPECT_NE(page->body.find("src=\"/assets/dashboard.js\""), std::string::npos);
  auto script = client.Get("/assets/dashboard.js");
  ASSERT_TRUE(script);
  EXPECT_EQ(script->status, 200);
  EXPECT_NE(script->body.find("/api/deployment"), std::string::npos);
  EXPECT_NE(script->get_header_value("Content-Type").find("javascript"), std::string::npos);
  EXPECT_EQ(client.Get("/assets/nothing.js")->status, 404);
  // Read-only.
  EXPECT_EQ(client.Post("/api/deployment", "", "text/plain")->status, 404);
}

TEST(Dashboard, WantsItsTokenAndSaysWhyARoleIsDown) {
  Registry r;
  MetricsServer role(r, loopback("the-roles-token"));
  DashboardOptions o;
  o.server = loopback("the-dashboards-token");
  o.job = "j";
  o.poll_every = 10ms;
  o.role_token = "wrong";
  o.roles = {{"offload0", "offload", role.url()}};
  Dashboard dashboard(o);
  EXPECT_EQ(dashboard.url(), "http://127.0.0.1:" + std::to_string(dashboard.port()) +
                                 "/?token=the-dashboards-token");
  httplib::Client client("127.0.0.1", dashboard.port());
  EXPECT_EQ(client.Get("/")->status, 401);
  EXPECT_EQ(client.Get("/api/deployment")->status, 401);
  EXPECT_EQ(client.Get("/assets/dashboard.css")->status, 401);
  auto page = client.Get("/?token=the-dashboards-token");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  // The page's own links carry the token, so the script and style load.
  EXPECT_NE(page->body.find("/assets/dashboard.js?token=the-dashboards-token"), std::string::npos);
  const auto d = wait_for(dashboard, [](const auto& d) {
    return !d["roles"][0]["error"].template get<std::string>().empty();
  });
  EXPECT_FALSE(d["roles"][0]["up"].get<bool>());
  EXPECT_NE(d["roles"][0]["error"].get<std::string>().find("HTTP 401"), std::string::npos)
      << d.dump(1);
}

TEST(Dashboard, RefusesOffLoopbackWithoutAToken) {
  DashboardOptions o;
  o.server.listen.host = "0.0.0.0";
  o.server.what = "dashboard_listen";
  EXPECT_THROW(Dashboard{o}, std::invalid_argument);
}

// A /api/state document with one counter series.
nlohmann::json counter_state(const std::string& name, double value, const Labels& labels = {}) {
  return {{"metrics",
           {{name, {{"type", "counter"}, {"series", {{{"labels", labels}, {"value", value}}}}}}}}};
}

// The same bytes, moved as a run moves them: the service counts each push as it comes
// (smoothly), the trainer once per step (its monitor records the step's total). Polled
// every 0.25 s, the two rates agree within one step's bytes over the window; over two polls
// alone (what the page used to compute) the trainer read 0 or 4x the service's rate.
TEST(LinkRates, TrainerAndServiceAgreeOnTheSameBytes) {
  const auto t0 = LinkRates::Clock::time_point{};
  const double step_bytes = 4000, window_seconds = 4.5;
  LinkRates trainer("trainer", std::chrono::milliseconds(4500));
  LinkRates service("offload", std::chrono::milliseconds(4500));
  for (int poll = 0; poll <= 50; ++poll) {
    const double t = poll * 0.25;  // one step a second
    const auto at = t0 + std::chrono::duration_cast<LinkRates::Clock::duration>(
                             std::chrono::duration<double>(t));
    trainer.add(at, counter_state("dsactor_train_pushed_bytes_total", step_bytes * std::floor(t)));
    service.add(at, counter_state("dsactor_offload_pushed_bytes_total", step_bytes * t,
                                  {{"path", "arena"}, {"job", "j"}}));
    if (t < window_seconds) continue;
    const auto tr = trainer.rates(), sr = service.rates();
    ASSERT_EQ(tr[0]["link"], "push to services");
    ASSERT_EQ(sr[1]["link"], "pushed in (arena)");
    EXPECT_TRUE(sr[0]["bytes_per_second"].is_null());  // no frames series: no rate
    const double trained = tr[0]["bytes_per_second"].get<double>();
    const double served = sr[1]["bytes_per_second"].get<double>();
    EXPECT_NEAR(served, step_bytes, 1e-6) << "t " << t;
    EXPECT_NEAR(trained, served, step_bytes / window_seconds + 1e-6) << "t " << t;
  }
}

// Both of a trainer's counters, as one /api/state document.
nlohmann::json trainer_state(double pushed, double fetched) {
  nlohmann::json state = counter_state("dsactor_train_pushed_bytes_total", pushed);
  state["metrics"].update(counter_state("dsactor_train_fetched_bytes_total", fetched)["metrics"]);
  return state;
}

// A restarted role (`dsactor up` restarts it) counts from 0 again: the window starts over
// at its first sample instead of showing a negative rate.
TEST(LinkRates, ARestartedCounterStartsItsRateOver) {
  LinkRates rates("trainer", std::chrono::seconds(10));
  const auto t0 = LinkRates::Clock::time_point{};
  rates.add(t0, trainer_state(5000, 7000));
  rates.add(t0 + std::chrono::seconds(1), trainer_state(10, 20));
  EXPECT_TRUE(rates.rates()[0]["bytes_per_second"].is_null()) << rates.rates().dump();
  EXPECT_TRUE(rates.rates()[1]["bytes_per_second"].is_null()) << rates.rates().dump();
  rates.add(t0 + std::chrono::seconds(2), trainer_state(50, 80));
  EXPECT_EQ(rates.rates()[0]["bytes_per_second"], 40.0);
  EXPECT_EQ(rates.rates()[1]["bytes_per_second"], 60.0);
}

// The trainer's collectives (each communicator's bytes summed over its operations) and the
// service's NVMe reads and writes are link figures of their own.
TEST(LinkRates, CollectivesPerCommunicatorAndNvmePerDirection) {
  auto trainer_at = [](double scale) {
    nlohmann::json state = counter_state("dsactor_train_collective_bytes_total", 1000 * scale,
                                         {{"comm", "grad"}, {"op", "allreduce"}});
    auto& series = state["metrics"]["dsactor_train_collective_bytes_total"]["series"];
    series.push_back({{"labels", {{"comm", "grad"}, {"op", "allgather"}}}, {"value", 500 * scale}});
    series.push_back(
        {{"labels", {{"comm", "param"}, {"op", "allgather"}}}, {"value", 300 * scale}});
    return state;
  };
  auto service_at = [](double scale) {
    nlohmann::json state = counter_state("dsactor_offload_nvme_read_bytes_total", 4096 * scale);
    state["metrics"].update(
        counter_state("dsactor_offload_nvme_written_bytes_total", 8192 * scale)["metrics"]);
    return state;
  };
  const auto t0 = LinkRates::Clock::time_point{};
  LinkRates trainer("trainer", std::chrono::seconds(10)),
      service("offload", std::chrono::seconds(10));
  trainer.add(t0, trainer_at(1));
  trainer.add(t0 + std::chrono::seconds(2), trainer_at(3));
  service.add(t0, service_at(1));
  service.add(t0 + std::chrono::seconds(2), service_at(3));
  const auto tr = trainer.rates(), sr = service.rates();
  ASSERT_EQ(tr.size(), 4u) << tr.dump();
  EXPECT_EQ(tr[2]["link"], "collectives (gradients)");
  EXPECT_EQ(tr[2]["bytes_per_second"], 1500.0);  // (1000 + 500) * 2 over 2 s
  EXPECT_EQ(tr[3]["link"], "collectives (parameters)");
  EXPECT_EQ(tr[3]["bytes_per_second"], 300.0);
  ASSERT_EQ(sr.size(), 4u) << sr.dump();
  EXPECT_EQ(sr[2]["link"], "NVMe read");
  EXPECT_EQ(sr[2]["bytes_per_second"], 4096.0);
  EXPECT_EQ(sr[3]["link"], "NVMe written");
  EXPECT_EQ(sr[3]["bytes_per_second"], 8192.0);
}

TEST(Dashboard, EscapesHtml) {
  EXPECT_EQ(html_escape("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
}

}  // namespace
}  // namespace dsactor::metrics
