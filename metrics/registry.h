#pragma once
// A process's metrics: counters, gauges and summaries, each a family (one name, one help
// line, one type) of series told apart by their labels. Registration takes a lock; the
// handles it returns stay valid for the registry's life and are updated lock-free (an
// atomic add or store), so a hot path keeps its handle and never looks a name up.
//
// Names follow Prometheus's conventions and are checked when registered: `dsactor_`
// first, snake_case, base units (seconds, bytes), counters end in `_total`; labels name
// bounded dimensions (job, role, rank, actor, service, phase; never a step number).

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsactor::metrics {

// Sorted by name, so a series' text is the same on every scrape.
using Labels = std::map<std::string, std::string>;

enum class MetricType { kCounter, kGauge, kSummary };
const char* to_string(MetricType type);

// Only goes up. add() of a negative amount throws std::invalid_argument.
class Counter {
 public:
  void add(double amount = 1);
  // Mirrors a count another part keeps (a gateway's request count, a store's steps).
  void set_total(double total) { value_.store(total, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void add(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Prometheus's summary without quantiles: the sum and count of what was observed, from
// which rate(sum) / rate(count) is the mean over any window.
class Summary {
 public:
  void observe(double value);
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  double count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> sum_{0};
  std::atomic<double> count_{0};
};

class Registry {
 public:
  // `constant` labels (job, role, rank, service) go on every series of this registry.
  explicit Registry(Labels constant = {});
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The series of family `name` with `labels`, created on first use. Throws
  // std::invalid_argument for a name or label that breaks the conventions above, and
  // std::logic_error when `name` was registered with another type or help text.
  Counter& counter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels = {});
  Summary& summary(std::string_view name, std::string_view help, const Labels& labels = {});

  // Runs before every exposition() and snapshot(), outside the registry's lock: mirrors
  // figures that another part keeps (a service's store statistics) at scrape time.
  void add_collector(std::function<void(Registry&)> collect);

  // A text beside the figures (an actor's last error), replacing the one of the same name
  // and labels: in snapshot() only, never in the exposition (a text is no sample, and as
  // a label value it would make a new series of every distinct text). `name` follows a
  // gauge's conventions. Meant for collectors, which set it at every scrape.
  void set_text(std::string_view name, const Labels& labels, std::string text);

  const Labels& constant_labels() const { return constant_; }
  // The Prometheus text exposition format, version 0.0.4: families sorted by name, each
  // with its HELP and TYPE lines.
  std::string exposition();
  // The same figures as JSON: {"labels": {...}, "metrics": {name: {"type", "help",
  // "series": [{"labels", "value"} or {"labels", "sum", "count"}]}}, "texts": {name:
  // [{"labels", "text"}]}}.
  nlohmann::json snapshot();

 private:
  struct Series;
  struct Family;
  Series& series(std::string_view name, std::string_view help, MetricType type,
                 const Labels& labels);
  void run_collectors();

  Labels constant_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_;
  std::vector<std::function<void(Registry&)>> collectors_;
  std::map<std::string, std::map<Labels, std::string>, std::less<>> texts_;
};

// Text-format helpers (exposed for the tests): a label value with `\`, `"` and line feeds
// escaped; a HELP text with `\` and line feeds escaped; a sample value (NaN, +Inf, -Inf,
// else the shortest decimal that reads back to the same double).
std::string escape_label_value(std::string_view value);
std::string escape_help(std::string_view help);
std::string format_value(double value);

}  // namespace dsactor::metrics
