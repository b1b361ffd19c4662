// The registry's Prometheus text and JSON forms: types, HELP/TYPE lines, label sets and
// escaping, and the naming rules it enforces.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "metrics/actor_figures.h"
#include "metrics/registry.h"
#include "metrics/state_figures.h"

namespace dsactor::metrics {
namespace {

bool contains(const std::string& text, const std::string& piece) {
  return text.find(piece) != std::string::npos;
}

TEST(MetricsRegistry, ExpositionHasHelpTypeAndConstantLabelsOnEverySeries) {
  Registry r(Labels{{"job", "j1"}, {"role", "trainer"}, {"rank", "0"}});
  r.gauge("dsactor_train_loss", "Mean training loss of the last step").set(2.5);
  r.counter("dsactor_train_steps_total", "Optimizer steps run").add(3);
  const std::string text = r.exposition();
  EXPECT_TRUE(contains(text,
                       "# HELP dsactor_train_loss Mean training loss of the last step\n"
                       "# TYPE dsactor_train_loss gauge\n"
                       "dsactor_train_loss{job=\"j1\",rank=\"0\",role=\"trainer\"} 2.5\n"))
      << text;
  EXPECT_TRUE(contains(text,
                       "# TYPE dsactor_train_steps_total counter\n"
                       "dsactor_train_steps_total{job=\"j1\",rank=\"0\",role=\"trainer\"} 3\n"))
      << text;
  // Families in name order, so a scrape's text is stable.
  EXPECT_LT(text.find("dsactor_train_loss"), text.find("dsactor_train_steps_total"));
}

TEST(MetricsRegistry, SummaryWritesSumAndCountPerLabelSet) {
  Registry r;
  auto& fwd = r.summary("dsactor_step_phase_seconds", "Phase time", {{"phase", "forward"}});
  auto& bwd = r.summary("dsactor_step_phase_seconds", "Phase time", {{"phase", "backward"}});
  fwd.observe(0.25);
  fwd.observe(0.5);
  bwd.observe(1);
  const std::string text = r.exposition();
  EXPECT_TRUE(contains(text, "# TYPE dsactor_step_phase_seconds summary\n")) << text;
  EXPECT_TRUE(contains(text, "dsactor_step_phase_seconds_sum{phase=\"forward\"} 0.75\n")) << text;
  EXPECT_TRUE(contains(text, "dsactor_step_phase_seconds_count{phase=\"forward\"} 2\n")) << text;
  EXPECT_TRUE(contains(text, "dsactor_step_phase_seconds_sum{phase=\"backward\"} 1\n")) << text;
  // One HELP/TYPE pair for the family, not one per series.
  EXPECT_EQ(text.find("# TYPE"), text.rfind("# TYPE"));
}

TEST(MetricsRegistry, SameNameAndLabelsIsTheSameSeries) {
  Registry r;
  r.counter("dsactor_x_bytes_total", "x", {{"service", "a"}}).add(5);
  r.counter("dsactor_x_bytes_total", "x", {{"service", "a"}}).add(7);
  r.counter("dsactor_x_bytes_total", "x", {{"service", "b"}}).add(1);
  EXPECT_EQ(r.counter("dsactor_x_bytes_total", "x", {{"service", "a"}}).value(), 12);
  EXPECT_TRUE(contains(r.exposition(), "dsactor_x_bytes_total{service=\"b\"} 1\n"));
}

TEST(MetricsRegistry, LabelValuesAndHelpAreEscaped) {
  Registry r(Labels{{"job", "a\"b\\c\nd"}});
  r.gauge("dsactor_g", "line one\nback\\slash \"quotes\" stay").set(1);
  const std::string text = r.exposition();
  EXPECT_TRUE(contains(text, "# HELP dsactor_g line one\\nback\\\\slash \"quotes\" stay\n"))
      << text;
  EXPECT_TRUE(contains(text, "dsactor_g{job=\"a\\\"b\\\\c\\nd\"} 1\n")) << text;
  EXPECT_EQ(escape_label_value("plain"), "plain");
}

TEST(MetricsRegistry, SpecialValuesUsePrometheusSpelling) {
  EXPECT_EQ(format_value(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(format_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(123456789012.0), "123456789012");
  // Round trip: the shortest text that reads back to the same double.
  const double loss = 5.5451774444795623;
  EXPECT_EQ(std::stod(format_value(loss)), loss);
}

TEST(MetricsRegistry, NamesAndLabelsBreakingTheConventionsAreRefused) {
  Registry r;
  EXPECT_THROW(r.gauge("train_loss", "no prefix"), std::invalid_argument);
  EXPECT_THROW(r.gauge("dsactor_TrainLoss", "camel case"), std::invalid_argument);
  EXPECT_THROW(r.counter("dsactor_steps", "counter without _total"), std::invalid_argument);
  EXPECT_THROW(r.gauge("dsactor_steps_total", "gauge with _total"), std::invalid_argument);
  EXPECT_THROW(r.gauge("dsactor_x_count", "summary suffix"), std::invalid_argument);
  EXPECT_THROW(r.gauge("dsactor_x", "bad label", {{"1abc", "v"}}), std::invalid_argument);
  EXPECT_THROW(r.gauge("dsactor_x", "reserved label", {{"quantile", "v"}}), std::invalid_argument);
  r.gauge("dsactor_y", "a gauge");
  EXPECT_THROW(r.counter("dsactor_y", "a gauge"), std::logic_error);
  EXPECT_THROW(r.gauge("dsactor_y", "another help"), std::logic_error);
  Registry c(Labels{{"job", "j"}});
  EXPECT_THROW(c.gauge("dsactor_z", "z", {{"job", "other"}}), std::invalid_argument);
  EXPECT_THROW(r.counter("dsactor_c_total", "c").add(-1), std::invalid_argument);
}

TEST(MetricsRegistry, CollectorsRunBeforeEachScrape) {
  Registry r;
  double source = 10;
  r.add_collector([&source](Registry& reg) {
    reg.counter("dsactor_mirrored_total", "mirrors source").set_total(source);
  });
  EXPECT_TRUE(contains(r.exposition(), "dsactor_mirrored_total 10\n"));
  source = 42;
  EXPECT_EQ(r.snapshot()["metrics"]["dsactor_mirrored_total"]["series"][0]["value"], 42);
}

TEST(MetricsRegistry, SnapshotCarriesTypesLabelsAndValues) {
  Registry r(Labels{{"role", "offload"}});
  r.gauge("dsactor_pinned_bytes", "pinned", {{"job", "a"}}).set(4096);
  r.summary("dsactor_wait_seconds", "wait").observe(2);
  const nlohmann::json s = r.snapshot();
  EXPECT_EQ(s["labels"]["role"], "offload");
  const auto& g = s["metrics"]["dsactor_pinned_bytes"];
  EXPECT_EQ(g["type"], "gauge");
  EXPECT_EQ(g["series"][0]["labels"]["job"], "a");
  EXPECT_EQ(g["series"][0]["value"], 4096);
  EXPECT_EQ(s["metrics"]["dsactor_wait_seconds"]["series"][0]["count"], 1);
  EXPECT_EQ(s["metrics"]["dsactor_wait_seconds"]["series"][0]["sum"], 2);
}

TEST(ActorFigures, CountMessagesHandlerTimeMailboxAndErrorsUnderTheActorLabel) {
  Registry r;
  auto board = std::make_shared<ActorBoard>();
  ActorBoard::publish(board, r);
  ActorFigures& monitor = board->actor("monitor");
  for (int i = 0; i < 3; ++i) ActorFigures::Handling handling(&monitor, 5 - i);
  { ActorFigures::Handling nobody_counts(nullptr, 7); }
  monitor.error("first failure");
  monitor.error("push_gradients of block h.0: service timed out\n" + std::string(400, 'x'));
  EXPECT_EQ(&board->actor("monitor"), &monitor);
  board->actor("engine");
  const nlohmann::json s = r.snapshot();
  const Labels actor{{"actor", "monitor"}};
  EXPECT_EQ(value_of(s, "dsactor_actor_messages_total", actor), 3);
  EXPECT_GE(value_of(s, "dsactor_actor_handler_seconds_total", actor).value_or(-1), 0);
  EXPECT_EQ(value_of(s, "dsactor_actor_mailbox_messages", actor), 3);
  EXPECT_EQ(value_of(s, "dsactor_actor_errors_total", actor), 2);
  EXPECT_GT(value_of(s, "dsactor_actor_last_error_timestamp_seconds", actor).value_or(0), 1e9);
  // The newest error's text, cut to its bound, in /api/state and never in the exposition.
  const auto text = text_of(s, "dsactor_actor_last_error", actor);
  ASSERT_TRUE(text);
  EXPECT_EQ(text->size(), ActorFigures::kMaxErrorText);
  EXPECT_EQ(text->rfind("push_gradients of block h.0: service timed out\n", 0), 0u) << *text;
  EXPECT_EQ(text_of(s, "dsactor_actor_last_error", {{"actor", "engine"}}), "");
  EXPECT_EQ(value_of(s, "dsactor_actor_messages_total", {{"actor", "engine"}}), 0);
  EXPECT_EQ(sum_of(s, "dsactor_actor_messages_total"), 3);
  const std::string text_form = r.exposition();
  EXPECT_EQ(text_form.find("timed out"), std::string::npos) << text_form;
  EXPECT_NE(text_form.find("dsactor_actor_errors_total{actor=\"monitor\"} 2"), std::string::npos)
      << text_form;
}

TEST(Registry, TextsFollowTheNamingRules) {
  Registry r;
  EXPECT_THROW(r.set_text("last_error", {}, "x"), std::invalid_argument);
  EXPECT_THROW(r.set_text("dsactor_last_error_total", {}, "x"), std::invalid_argument);
  EXPECT_THROW(r.set_text("dsactor_last_error", {{"bad-label", "a"}}, "x"), std::invalid_argument);
  r.set_text("dsactor_last_error", {{"actor", "a"}}, "one");
  r.set_text("dsactor_last_error", {{"actor", "a"}}, "two");
  EXPECT_EQ(text_of(r.snapshot(), "dsactor_last_error", {{"actor", "a"}}), "two");
}

}  // namespace
}  // namespace dsactor::metrics
