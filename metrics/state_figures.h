#pragma once
// Reading figures back out of a process's /api/state (Registry::snapshot()'s JSON): what
// the dashboard's history and `dsactor status` take from each role.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrics/registry.h"

namespace dsactor::metrics {

// The value (a summary's sum) of the first series of `name` whose labels include `labels`;
// none when the process has no such series.
std::optional<double> value_of(const nlohmann::json& state, const std::string& name,
                               const Labels& labels = {});
// The sum over every series of `name` whose labels include `labels` (0 when none).
double sum_of(const nlohmann::json& state, const std::string& name, const Labels& labels = {});
// The text (Registry::set_text) of `name` whose labels include `labels`; none when absent.
std::optional<std::string> text_of(const nlohmann::json& state, const std::string& name,
                                   const Labels& labels = {});
// (value of `label`, value) for every series of `name` that has `label`.
std::vector<std::pair<std::string, double>> label_values(const nlohmann::json& state,
                                                         const std::string& name,
                                                         const std::string& label);

}  // namespace dsactor::metrics
