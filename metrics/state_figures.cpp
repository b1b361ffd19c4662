#include "metrics/state_figures.h"

#include <limits>

namespace dsactor::metrics {

namespace {

using nlohmann::json;

const json* series_of(const json& state, const std::string& name) {
  if (!state.is_object() || !state.contains("metrics")) return nullptr;
  const json& metrics = state["metrics"];
  if (!metrics.contains(name)) return nullptr;
  return &metrics[name]["series"];
}

bool has_labels(const json& series, const Labels& labels) {
  const json& have = series["labels"];
  for (const auto& [k, v] : labels)
    if (!have.contains(k) || have[k] != v) return false;
  return true;
}

// A summary's sum; NaN where the JSON has null (how nlohmann writes a NaN gauge).
double sample(const json& series) {
  const json& v = series.contains("value") ? series["value"] : series["sum"];
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

std::optional<double> value_of(const json& state, const std::string& name, const Labels& labels) {
  const json* all = series_of(state, name);
  if (!all) return std::nullopt;
  for (const auto& s : *all)
    if (has_labels(s, labels)) return sample(s);
  return std::nullopt;
}

double sum_of(const json& state, const std::string& name, const Labels& labels) {
  const json* all = series_of(state, name);
  double total = 0;
  if (all)
    for (const auto& s : *all)
      if (has_labels(s, labels)) total += sample(s);
  return total;
}

std::optional<std::string> text_of(const json& state, const std::string& name,
                                   const Labels& labels) {
  if (!state.is_object() || !state.contains("texts") || !state["texts"].contains(name))
    return std::nullopt;
  for (const auto& t : state["texts"][name])
    if (has_labels(t, labels)) return t["text"].get<std::string>();
  return std::nullopt;
}

std::vector<std::pair<std::string, double>> label_values(const json& state, const std::string& name,
                                                         const std::string& label) {
  std::vector<std::pair<std::string, double>> out;
  const json* all = series_of(state, name);
  if (!all) return out;
  for (const auto& s : *all)
    if (s["labels"].contains(label))
      out.emplace_back(s["labels"][label].get<std::string>(), sample(s));
  return out;
}

}  // namespace dsactor::metrics
