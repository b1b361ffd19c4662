#include "key_table/key_error.h"

#include <vector>

#include <fmt/format.h>

#include "key_table/key_suggestion.h"

namespace dsactor::key_table {

std::string Location::message(std::string_view path, std::string_view problem) const {
  const std::string where = line > 0 ? fmt::format("{}:{}", file, line) : std::string(file);
  if (path.empty()) return fmt::format("{}: {}", where, problem);
  return fmt::format("{}: {}: {}", where, path, problem);
}

std::string expected_problem(const KeySpec& spec, std::string_view got) {
  return fmt::format("expected {}, got {}", allowed_text(spec), got);
}

std::string not_allowed_problem(const KeySpec& spec, std::string_view shown) {
  return not_allowed_problem(spec, shown, spec.range());
}

std::string not_allowed_problem(const KeySpec& spec, std::string_view shown, const Range& range) {
  return fmt::format("value {} is not allowed; expected {}", shown, allowed_text(spec, range));
}

std::optional<std::string_view> match_choice(const KeySpec& spec, std::string_view text) {
  const auto same = [&](std::string_view a) {
    return spec.icase ? lower(a) == lower(text) : a == text;
  };
  for (auto c : spec.choices)
    if (same(c)) return c;
  for (const auto& [alias, canonical] : spec.choice_aliases)
    if (same(alias)) return canonical;
  return std::nullopt;
}

std::string choice_problem(const KeySpec& spec, std::string_view text) {
  std::vector<std::string> choices(spec.choices.begin(), spec.choices.end());
  for (auto u : spec.unsupported)
    if (lower(u) == lower(text))
      return fmt::format("value \"{}\" is a choice dsactor does not support; supported: \"{}\"",
                         text, fmt::join(choices, "\", \""));
  return not_allowed_problem(spec, fmt::format("\"{}\"", text)) + did_you_mean(text, choices);
}

}  // namespace dsactor::key_table
