#include "key_table/byte_size.h"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "key_table/key_suggestion.h"

namespace dsactor::key_table {
namespace {

constexpr std::array<std::pair<std::string_view, double>, 14> kUnits = {{
    {"", 1.0},
    {"b", 1.0},
    {"k", 1024.0},
    {"kib", 1024.0},
    {"m", 1048576.0},
    {"mib", 1048576.0},
    {"g", 1073741824.0},
    {"gib", 1073741824.0},
    {"t", 1099511627776.0},
    {"tib", 1099511627776.0},
    {"kb", 1e3},
    {"mb", 1e6},
    {"gb", 1e9},
    {"tb", 1e12},
}};

std::optional<uint64_t> scaled(const std::string& number, double multiplier) {
  if (number.find('.') == std::string::npos) {
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
    if (ec != std::errc() || end != number.data() + number.size()) return std::nullopt;
    const auto m = static_cast<uint64_t>(multiplier);
    if (v != 0 && m > std::numeric_limits<uint64_t>::max() / v) return std::nullopt;
    return v * m;
  }
  char* end = nullptr;
  const double d = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(d)) return std::nullopt;
  const double bytes = d * multiplier;
  if (bytes != std::floor(bytes) || bytes >= 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

}  // namespace

std::optional<uint64_t> parse_byte_size(std::string_view text) {
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return std::nullopt;
  std::string suffix = lower(text.substr(i));
  while (!suffix.empty() && suffix.front() == ' ') suffix.erase(0, 1);
  for (const auto& [name, multiplier] : kUnits)
    if (suffix == name) return scaled(std::string(text.substr(0, i)), multiplier);
  return std::nullopt;
}

std::string byte_size_text(uint64_t bytes) {
  constexpr std::array<std::pair<std::string_view, int>, 4> kBinary = {
      {{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}}};
  for (const auto& [unit, shift] : kBinary) {
    const uint64_t one = uint64_t{1} << shift;
    if (bytes != 0 && bytes % one == 0) return std::to_string(bytes / one) + std::string(unit);
  }
  return std::to_string(bytes);
}

}  // namespace dsactor::key_table
