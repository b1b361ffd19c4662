#include "metrics/registry.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace dsactor::metrics {

struct Registry::Series {
  Counter counter;
  Gauge gauge;
  Summary summary;
};

struct Registry::Family {
  std::string help;
  MetricType type;
  std::map<Labels, std::unique_ptr<Series>> series;
};

namespace {

bool is_name_char(char c, bool first) {
  const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  return first ? letter : letter || (c >= '0' && c <= '9');
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

void check_name(std::string_view name, MetricType type) {
  auto fail = [&](std::string_view rule) {
    throw std::invalid_argument(
        fmt::format("metric name \"{}\" ({}): {}", name, to_string(type), rule));
  };
  if (name.substr(0, 8) != "dsactor_" || name.size() == 8)
    fail("must start with \"dsactor_\" and name something after it");
  for (char c : name)
    if (!is_name_char(c, false) || (c >= 'A' && c <= 'Z'))
      fail("only lower-case letters, digits and '_' (snake_case)");
  const bool total = ends_with(name, "_total");
  if (type == MetricType::kCounter && !total) fail("a counter's name ends in \"_total\"");
  if (type != MetricType::kCounter && total) fail("only a counter's name ends in \"_total\"");
  for (std::string_view reserved : {"_sum", "_count", "_bucket"})
    if (ends_with(name, reserved)) fail(fmt::format("\"{}\" is a summary's suffix", reserved));
}

void check_labels(std::string_view name, const Labels& labels) {
  for (const auto& [key, value] : labels) {
    bool ok = !key.empty() && key.substr(0, 2) != "__" && key != "le" && key != "quantile";
    for (size_t i = 0; ok && i < key.size(); ++i) ok = is_name_char(key[i], i == 0);
    if (!ok)
      throw std::invalid_argument(fmt::format(
          "metric {}: label name \"{}\" is not [a-zA-Z_][a-zA-Z0-9_]* (nor \"__*\", \"le\", "
          "\"quantile\")",
          name, key));
  }
}

// {a="1",b="2"} of the constant and the series' labels; "" when there are none.
std::string label_text(const Labels& constant, const Labels& labels) {
  Labels all = constant;
  all.insert(labels.begin(), labels.end());
  if (all.empty()) return {};
  std::string out = "{";
  for (const auto& [key, value] : all) {
    if (out.size() > 1) out += ',';
    out += fmt::format("{}=\"{}\"", key, escape_label_value(value));
  }
  return out + "}";
}

}  // namespace

const char* to_string(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kSummary:
      return "summary";
  }
  return "untyped";
}

void Counter::add(double amount) {
  if (!(amount >= 0))
    throw std::invalid_argument(fmt::format("counter add({}): a counter only goes up", amount));
  value_.fetch_add(amount, std::memory_order_relaxed);
}

void Summary::observe(double value) {
  sum_.fetch_add(value, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

Registry::Registry(Labels constant) : constant_(std::move(constant)) {
  check_labels("(constant labels)", constant_);
}

Registry::~Registry() = default;

Registry::Series& Registry::series(std::string_view name, std::string_view help, MetricType type,
                                   const Labels& labels) {
  std::lock_guard lock(mutex_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    const Family& f = *it->second;
    if (f.type != type || f.help != help)
      throw std::logic_error(
          fmt::format("metric {} registered twice: as {} \"{}\" and as {} \"{}\"", name,
                      to_string(f.type), f.help, to_string(type), help));
    if (auto s = f.series.find(labels); s != f.series.end()) return *s->second;
  }
  // Everything is checked before anything is added, so a refused call leaves no trace.
  if (it == families_.end()) check_name(name, type);
  check_labels(name, labels);
  for (const auto& [key, value] : labels)
    if (constant_.count(key))
      throw std::invalid_argument(fmt::format(
          "metric {}: label \"{}\" is one of the registry's constant labels", name, key));
  if (it == families_.end())
    it = families_.emplace(std::string(name), std::make_unique<Family>(std::string(help), type))
             .first;
  auto s = it->second->series.emplace(labels, std::make_unique<Series>()).first;
  return *s->second;
}

Counter& Registry::counter(std::string_view name, std::string_view help, const Labels& labels) {
  return series(name, help, MetricType::kCounter, labels).counter;
}

Gauge& Registry::gauge(std::string_view name, std::string_view help, const Labels& labels) {
  return series(name, help, MetricType::kGauge, labels).gauge;
}

Summary& Registry::summary(std::string_view name, std::string_view help, const Labels& labels) {
  return series(name, help, MetricType::kSummary, labels).summary;
}

void Registry::set_text(std::string_view name, const Labels& labels, std::string text) {
  std::lock_guard lock(mutex_);
  auto it = texts_.find(name);
  if (it == texts_.end()) {
    check_name(name, MetricType::kGauge);
    check_labels(name, labels);
    it = texts_.emplace(std::string(name), std::map<Labels, std::string>{}).first;
  } else if (!it->second.count(labels)) {
    check_labels(name, labels);
  }
  it->second[labels] = std::move(text);
}

void Registry::add_collector(std::function<void(Registry&)> collect) {
  std::lock_guard lock(mutex_);
  collectors_.push_back(std::move(collect));
}

void Registry::run_collectors() {
  std::vector<std::function<void(Registry&)>> collectors;
  {
    std::lock_guard lock(mutex_);
    collectors = collectors_;
  }
  for (auto& collect : collectors) collect(*this);
}

std::string Registry::exposition() {
  run_collectors();
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [name, f] : families_) {
    if (f->series.empty()) continue;
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escape_help(f->help), name,
                       to_string(f->type));
    for (const auto& [labels, s] : f->series) {
      const std::string l = label_text(constant_, labels);
      switch (f->type) {
        case MetricType::kCounter:
          out += fmt::format("{}{} {}\n", name, l, format_value(s->counter.value()));
          break;
        case MetricType::kGauge:
          out += fmt::format("{}{} {}\n", name, l, format_value(s->gauge.value()));
          break;
        case MetricType::kSummary:
          out +=
              fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, l, format_value(s->summary.sum()),
                          name, l, format_value(s->summary.count()));
          break;
      }
    }
  }
  return out;
}

nlohmann::json Registry::snapshot() {
  run_collectors();
  std::lock_guard lock(mutex_);
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& [name, f] : families_) {
    nlohmann::json series = nlohmann::json::array();
    for (const auto& [labels, s] : f->series) {
      nlohmann::json one{{"labels", labels}};
      if (f->type == MetricType::kSummary) {
        one["sum"] = s->summary.sum();
        one["count"] = s->summary.count();
      } else {
        one["value"] = f->type == MetricType::kCounter ? s->counter.value() : s->gauge.value();
      }
      series.push_back(std::move(one));
    }
    metrics[name] = {{"type", to_string(f->type)}, {"help", f->help}, {"series", series}};
  }
  nlohmann::json texts = nlohmann::json::object();
  for (const auto& [name, by_labels] : texts_)
    for (const auto& [labels, text] : by_labels)
      texts[name].push_back({{"labels", labels}, {"text", text}});
  return {{"labels", constant_}, {"metrics", std::move(metrics)}, {"texts", std::move(texts)}};
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

}  // namespace dsactor::metrics
