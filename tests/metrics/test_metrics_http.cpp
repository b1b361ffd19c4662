// MetricsServer on 127.0.0.1: a real HTTP round trip for /metrics and /api/state, the
// token rule, and the listen-address parser.
#include <gtest/gtest.h>
#include <httplib.h>

#include <stdexcept>

#include "metrics/http_server.h"

namespace dsactor::metrics {
namespace {

ServerOptions on_loopback(std::string token = "") {
  ServerOptions o;
  o.listen.host = "127.0.0.1";
  o.listen.port = 0;
  o.token = std::move(token);
  o.what = "test";
  return o;
}

TEST(MetricsHttp, ServesExpositionAndStateOnLoopback) {
  Registry r(Labels{{"role", "trainer"}});
  auto& loss = r.gauge("dsactor_train_loss", "loss");
  loss.set(3.25);
  MetricsServer server(r, on_loopback(), [] { return nlohmann::json{{"name", "trainer0"}}; });
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(server.url(), "http://127.0.0.1:" + std::to_string(server.port()));
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->get_header_value("Content-Type").find("version=0.0.4"), std::string::npos);
  EXPECT_NE(res->body.find("dsactor_train_loss{role=\"trainer\"} 3.25\n"), std::string::npos)
      << res->body;
  // Live values: the next scrape sees the new one.
  loss.set(2);
  res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_NE(res->body.find("dsactor_train_loss{role=\"trainer\"} 2\n"), std::string::npos);

  res = client.Get("/api/state");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const auto state = nlohmann::json::parse(res->body);
  EXPECT_EQ(state["process"]["name"], "trainer0");
  EXPECT_EQ(state["metrics"]["dsactor_train_loss"]["series"][0]["value"], 2);
  // Read-only: nothing but GET of the two paths.
  res = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_NE(res->status, 200);
  EXPECT_EQ(client.Get("/")->status, 404);
}

// An error text can carry bytes a peer sent (a job name, a field), cut at a byte bound in
// the middle of a character: /api/state still answers, as JSON, with those bytes replaced.
TEST(MetricsHttp, StateWithInvalidUtf8TextIsStillServed) {
  Registry r(Labels{{"role", "offload"}});
  r.set_text("dsactor_actor_last_error", Labels{{"actor", "gateway"}},
             "refused job '\xff\xfe' and a cut \xe2\x82");
  MetricsServer server(r, on_loopback(), [] { return nlohmann::json{{"name", "svc"}}; });
  ASSERT_GT(server.port(), 0);
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/api/state");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200);
  const auto state = nlohmann::json::parse(res->body);
  const std::string text = state["texts"]["dsactor_actor_last_error"][0]["text"];
  EXPECT_EQ(text.rfind("refused job '", 0), 0u) << text;
}

TEST(MetricsHttp, TokenIsRequiredWhenSet) {
  Registry r;
  r.gauge("dsactor_g", "g").set(1);
  MetricsServer server(r, on_loopback("s3cret"));
  httplib::Client client("127.0.0.1", server.port());
  EXPECT_EQ(client.Get("/metrics")->status, 401);
  EXPECT_EQ(client.Get("/metrics?token=wrong")->status, 401);
  EXPECT_EQ(client.Get("/metrics?token=s3cret")->status, 200);
  EXPECT_EQ(client.Get("/api/state", {{"Authorization", "Bearer s3cret"}})->status, 200);
}

TEST(MetricsHttp, OffLoopbackWithoutTokenIsRefused) {
  Registry r;
  try {
    ServerOptions o = on_loopback();
    o.listen.host = "0.0.0.0";
    o.what = "--metrics-listen";
    MetricsServer server(r, o);
    FAIL() << "bound 0.0.0.0 without a token";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--metrics-listen 0.0.0.0:0"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("token"), std::string::npos);
  }
}

TEST(MetricsHttp, PortInUseIsAnError) {
  Registry r;
  MetricsServer first(r, on_loopback());
  ServerOptions o = on_loopback();
  o.listen.port = first.port();
  EXPECT_THROW(MetricsServer(r, o), std::runtime_error);
}

TEST(MetricsHttp, ListenAddressParsing) {
  auto a = parse_listen_address("127.0.0.1:9100", "--metrics-listen");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 9100);
  a = parse_listen_address("[::1]:0", "--metrics-listen");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 0);
  for (const char* bad : {"9100", "host:", "host:x", "host:70000", "::1:80", ":80"}) {
    try {
      parse_listen_address(bad, "--metrics-listen");
      ADD_FAILURE() << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--metrics-listen"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("HOST:PORT"), std::string::npos);
    }
  }
  EXPECT_TRUE(is_loopback("127.0.0.1"));
  EXPECT_TRUE(is_loopback("localhost"));
  EXPECT_TRUE(is_loopback("::1"));
  EXPECT_FALSE(is_loopback("0.0.0.0"));
  EXPECT_FALSE(is_loopback("10.0.0.1"));
}

}  // namespace
}  // namespace dsactor::metrics
