// A real offload service and a ZeRO-3 trainer against it, both with --metrics-listen on
// 127.0.0.1:0: /metrics is scraped during the run, the trainer's dsactor_train_loss equals
// the CSV monitor's row for the same step, the service counts the job's pushed bytes and
// commits, and promtool (Debian's prometheus package) accepts both expositions.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "tests/cli/child_process.h"
#include "tests/deploy/deploy_test_util.h"
#include "tests/metrics/tiny_offload_run.h"

namespace dsactor {
namespace {

using dsactor::testing::Child;
using dsactor::testing::free_port;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;
using namespace std::chrono_literals;

// The port a role logged in "metrics on http://127.0.0.1:PORT/metrics".
int logged_metrics_port(Child& child) {
  if (!child.wait_for_err("/metrics and", 120s)) return -1;
  std::smatch m;
  const std::string log = child.log();
  if (!std::regex_search(log, m, std::regex(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)")))
    return -1;
  return std::stoi(m[1]);
}

std::optional<std::string> scrape(int port, const std::string& path = "/metrics") {
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get(path.c_str());
  if (!res || res->status != 200) return std::nullopt;
  return res->body;
}

// The value text of the one sample of `name` whose labels contain `labels` ("" for any).
std::optional<std::string> sample(const std::string& text, const std::string& name,
                                  const std::string& labels = "") {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) != 0 && line.rfind(name + " ", 0) != 0) continue;
    if (line.find(labels) == std::string::npos) continue;
    return line.substr(line.rfind(' ') + 1);
  }
  return std::nullopt;
}

// The CSV monitor's value for `step` ("step,value" rows), as written.
std::optional<std::string> csv_value(const std::filesystem::path& file, const std::string& step) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(step + ",", 0) == 0) return line.substr(step.size() + 1);
  return std::nullopt;
}

bool have_promtool() {
  return std::system("command -v promtool >/dev/null 2>&1") == 0;
}

// promtool's verdict on an exposition ("" when it passes).
std::string promtool_problems(const std::filesystem::path& dir, const std::string& name,
                              const std::string& text) {
  write_file(dir / (name + ".prom"), text);
  const auto report = dir / (name + ".promtool");
  const std::string cmd = "promtool check metrics < '" + (dir / (name + ".prom")).string() +
                          "' > '" + report.string() + "' 2>&1";
  if (std::system(cmd.c_str()) == 0) return "";
  std::ifstream in(report);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str().empty() ? "promtool failed" : ss.str();
}

// Two scrapes in a row that agree on the step (>= 3) and the loss: a step's figures, not a
// mix of two steps' (the monitor sets them one after the other).
struct StableScrape {
  std::string text, step, loss;
};
std::optional<StableScrape> stable_scrape(int port) {
  const auto deadline = std::chrono::steady_clock::now() + 300s;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto a = scrape(port), b = scrape(port);
    if (!a || !b) return std::nullopt;
    const auto s1 = sample(*a, "dsactor_train_global_step"),
               s2 = sample(*b, "dsactor_train_global_step");
    const auto l1 = sample(*a, "dsactor_train_loss"), l2 = sample(*b, "dsactor_train_loss");
    if (s1 && s2 && l1 && l2 && *s1 == *s2 && *l1 == *l2 && std::stoll(*s1) >= 3)
      return StableScrape{*b, *s1, *l1};
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

// Every actor we own counted the messages it handled and the time it spent on them: the
// trainer's engine, monitor, step client and stage 3's fetcher and its client, and the
// service's gateway, coordinator and partition worker.
void expect_every_actor_counted(const std::string& trainer_scrape,
                                const std::string& service_scrape, const std::string& endpoint) {
  const std::vector<std::string> trainer_actors = {
      "engine", "monitor", "service_client " + endpoint, "fetcher", "fetch_client " + endpoint};
  for (const auto& actor : trainer_actors) {
    const std::string label = "actor=\"" + actor + "\"";
    const auto messages = sample(trainer_scrape, "dsactor_actor_messages_total", label);
    const auto seconds = sample(trainer_scrape, "dsactor_actor_handler_seconds_total", label);
    ASSERT_TRUE(messages && seconds) << actor << "\n" << trainer_scrape;
    EXPECT_GT(std::stod(*messages), 0) << actor;
    EXPECT_GT(std::stod(*seconds), 0) << actor;
  }
  for (const std::string actor : {"gateway", "coordinator", "partition_worker0"}) {
    const auto messages =
        sample(service_scrape, "dsactor_actor_messages_total", "actor=\"" + actor + "\"");
    ASSERT_TRUE(messages) << actor << "\n" << service_scrape;
    EXPECT_GT(std::stod(*messages), 0) << actor;
  }
}

// A request the gateway cannot decode (its answer awaited): the gateway's last error then
// says why, in /api/state.
void send_undecodable_request(const std::string& endpoint) {
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(endpoint);
  const std::string garbage = "not a request";
  std::vector<zmq::message_t> frames;
  frames.emplace_back();
  frames.emplace_back(garbage.data(), garbage.size());
  (void)zmq::send_multipart(dealer, frames);
  std::vector<zmq::message_t> reply;
  zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
  ASSERT_GT(zmq::poll(&item, 1, std::chrono::milliseconds(60000)), 0) << "no answer";
  (void)zmq::recv_multipart(dealer, std::back_inserter(reply));
}

TEST(MetricsEndToEnd, TrainerAndServiceServeWhatTheRunDoes) {
  TempDir dir;
  dsactor::testing::write_tiny_offload_run(dir.path(), "metrics are what a run shows", "e2e");
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(free_port());
  Child service(dir.path(),
                {"start", "--role", "offload", "--listen", endpoint, "--no-mlock", "--insecure",
                 "--state-dir", (dir / "state").string(), "--metrics-listen", "127.0.0.1:0"},
                dir / "service.log");
  const int service_port = logged_metrics_port(service);
  ASSERT_GT(service_port, 0) << service.log();
  ASSERT_TRUE(service.wait_for_err("listening on", 60s)) << service.log();
  Child trainer(dir.path(), {"start",   "--role",  "trainer",    "--config",         "ds.json",
                             "--model", "tiny",    "--data",     "corpus.txt",       "--seq",
                             "16",      "--steps", "100000",     "--offload",        endpoint,
                             "--job",   "e2e-job", "--insecure", "--metrics-listen", "127.0.0.1:0"},
                dir / "trainer.log");
  const int trainer_port = logged_metrics_port(trainer);
  ASSERT_GT(trainer_port, 0) << trainer.log();

  const auto stable = stable_scrape(trainer_port);
  ASSERT_TRUE(stable) << "no stable scrape during the run\n" << trainer.log();
  const std::string& during = stable->text;
  const std::string& step = stable->step;
  const std::string& loss = stable->loss;
  const auto csv = csv_value(dir / "monitor" / "e2e" / "Train_Samples_train_loss.csv", step);
  ASSERT_TRUE(csv) << "no CSV row for step " << step;
  EXPECT_EQ(loss, *csv) << "step " << step;
  EXPECT_NE(during.find("role=\"trainer\""), std::string::npos) << during;
  EXPECT_NE(during.find("job=\"e2e-job\""), std::string::npos) << during;
  EXPECT_TRUE(sample(during, "dsactor_train_phase_seconds_count", "phase=\"fetch\""));
  const auto pushed = sample(during, "dsactor_train_pushed_bytes_total");
  ASSERT_TRUE(pushed) << during;
  EXPECT_GT(std::stod(*pushed), 0);

  const auto state = scrape(trainer_port, "/api/state");
  ASSERT_TRUE(state);
  const auto json = nlohmann::json::parse(*state);
  EXPECT_EQ(json["process"]["role"], "trainer");
  EXPECT_GE(json["metrics"]["dsactor_train_global_step"]["series"][0]["value"].get<double>(), 3);

  const auto served = scrape(service_port);
  ASSERT_TRUE(served) << service.log();
  // One rank, same host: the gradients go through the shared-memory arena.
  const auto arena = sample(*served, "dsactor_offload_pushed_bytes_total", "path=\"arena\"");
  const auto frames = sample(*served, "dsactor_offload_pushed_bytes_total", "path=\"frames\"");
  ASSERT_TRUE(arena && frames) << *served;
  EXPECT_GT(std::stod(*arena) + std::stod(*frames), 0) << *served;
  EXPECT_NE(served->find("job=\"e2e-job\""), std::string::npos) << *served;
  const auto commits = sample(*served, "dsactor_offload_commits_total", "job=\"e2e-job\"");
  ASSERT_TRUE(commits) << *served;
  EXPECT_GE(std::stod(*commits), 3);
  const auto ram = sample(*served, "dsactor_offload_ram_bytes");
  const auto limit = sample(*served, "dsactor_offload_ram_limit_bytes");
  ASSERT_TRUE(ram && limit) << *served;
  EXPECT_GT(std::stod(*ram), 0);
  EXPECT_GE(std::stod(*limit), std::stod(*ram));

  const auto trainer_now = scrape(trainer_port);
  ASSERT_TRUE(trainer_now);
  expect_every_actor_counted(*trainer_now, *served, endpoint);
  send_undecodable_request(endpoint);
  const auto service_state = scrape(service_port, "/api/state");
  ASSERT_TRUE(service_state);
  const auto sj = nlohmann::json::parse(*service_state);
  std::string gateway_error;
  for (const auto& t : sj["texts"]["dsactor_actor_last_error"])
    if (t["labels"]["actor"] == "gateway") gateway_error = t["text"];
  EXPECT_EQ(gateway_error.rfind("refused a request: ", 0), 0u) << sj["texts"].dump(1);
  EXPECT_EQ(sample(*scrape(service_port), "dsactor_actor_errors_total", "actor=\"gateway\""), "1");

  trainer.signal(SIGTERM);
  EXPECT_EQ(trainer.wait(120s), 128 + SIGTERM) << trainer.log();
  // Once the run has stopped, the service has counted every byte the trainer says it pushed.
  const std::string log = trainer.log();
  const auto at = log.find("; pushed ");
  ASSERT_NE(at, std::string::npos) << log;
  const double trainer_pushed = std::stod(log.substr(at + 9));
  const auto after = scrape(service_port);
  ASSERT_TRUE(after) << service.log();
  const auto arena_after = sample(*after, "dsactor_offload_pushed_bytes_total", "path=\"arena\"");
  const auto frames_after = sample(*after, "dsactor_offload_pushed_bytes_total", "path=\"frames\"");
  ASSERT_TRUE(arena_after && frames_after) << *after;
  EXPECT_EQ(std::stod(*arena_after) + std::stod(*frames_after), trainer_pushed) << *after;
  service.signal(SIGTERM);
  EXPECT_EQ(service.wait(60s), 0) << service.log();

  if (!have_promtool()) GTEST_SKIP() << "promtool not installed (scripts/install-deps.sh)";
  EXPECT_EQ(promtool_problems(dir.path(), "trainer", during), "") << during;
  EXPECT_EQ(promtool_problems(dir.path(), "service", *served), "") << *served;
}

// Without a coordinator role, trainer rank 0 hosts the rendezvous store: its /api/state
// lists the store as one of its actors and carries the store's figures (what the dashboard
// and `dsactor status` show). Rank 0 alone is enough: it waits in the store for rank 1,
// its own address already a key there.
TEST(MetricsEndToEnd, ARankZeroTrainerShowsTheRendezvousStoreItHosts) {
  TempDir dir;
  std::string corpus;
  for (int i = 0; i < 100; ++i) corpus += "a store on rank zero " + std::to_string(i) + "\n";
  write_file(dir / "corpus.txt", corpus);
  write_file(dir / "ds.json", R"({"train_micro_batch_size_per_gpu": 1})");
  const std::string coordinator = "tcp://127.0.0.1:" + std::to_string(free_port());
  Child rank0(dir.path(), {"start",      "--role",
                           "trainer",    "--config",
                           "ds.json",    "--model",
                           "tiny",       "--data",
                           "corpus.txt", "--seq",
                           "16",         "--steps",
                           "10",         "--rank",
                           "0",          "--world-size",
                           "2",          "--coordinator",
                           coordinator,  "--serve-coordinator",
                           "--insecure", "--comm-timeout-ms",
                           "120000",     "--metrics-listen",
                           "127.0.0.1:0"},
              dir / "rank0.log");
  const int port = logged_metrics_port(rank0);
  ASSERT_GT(port, 0) << rank0.log();
  nlohmann::json state;
  double keys = -1;  // none yet
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (std::chrono::steady_clock::now() < deadline && keys < 1) {
    std::this_thread::sleep_for(100ms);
    const auto body = scrape(port, "/api/state");
    if (!body) continue;
    state = nlohmann::json::parse(*body);
    keys = -1;
    for (const auto& s : state["metrics"]
                             .value("dsactor_rendezvous_keys", nlohmann::json{})
                             .value("series", nlohmann::json::array()))
      if (s["labels"].value("actor", "") == "rendezvous_store") keys = s["value"].get<double>();
  }
  EXPECT_GE(keys, 1) << state.dump(1) << "\n" << rank0.log();
  const auto actors = state["process"]["actors"];
  EXPECT_NE(std::find(actors.begin(), actors.end(), "rendezvous_store"), actors.end())
      << actors.dump();
  const auto text = scrape(port);
  ASSERT_TRUE(text);
  EXPECT_TRUE(sample(*text, "dsactor_rendezvous_jobs", "actor=\"rendezvous_store\"")) << *text;
  rank0.signal(SIGKILL);
  rank0.wait(60s);
}

TEST(MetricsEndToEnd, OffLoopbackWithoutTokenIsRefusedAtStart) {
  TempDir dir;
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(free_port());
  Child service(dir.path(),
                {"start", "--role", "offload", "--listen", endpoint, "--no-mlock", "--insecure",
                 "--state-dir", (dir / "state").string(), "--metrics-listen", "0.0.0.0:0"},
                dir / "service.log");
  EXPECT_NE(service.wait(60s), 0);
  EXPECT_NE(service.log().find("--metrics-listen 0.0.0.0:0: off loopback the metrics need a token"),
            std::string::npos)
      << service.log();
}

}  // namespace
}  // namespace dsactor
