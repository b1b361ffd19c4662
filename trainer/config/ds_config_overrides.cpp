// `--set key.path=value`: a key of the ds_config given on the command line (or in a deploy
// file's config_overrides), applied to the file's JSON tree before it is parsed, so an
// override is checked exactly like the file's own keys.
#include <fmt/format.h>

#include "trainer/config/ds_config.h"

namespace dsactor::trainer {
namespace {

using json = nlohmann::json;

// JSON when the text is JSON ("1e-4", "8", "true", "[0.9, 0.95]", "\"x\""), else the text.
json override_value(const std::string& text) {
  json v = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return v.is_discarded() ? json(text) : v;
}

std::vector<std::string> split_path(const ConfigOverride& o) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    const size_t dot = o.path.find('.', begin);
    parts.push_back(o.path.substr(begin, dot - begin));
    if (parts.back().empty())
      throw ConfigError(
          fmt::format("--set {}={}: the key path has an empty part", o.path, o.value));
    if (dot == std::string::npos) return parts;
    begin = dot + 1;
  }
}

}  // namespace

ConfigOverride parse_config_override(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(fmt::format(
        "--set {}: expected KEY.PATH=VALUE (e.g. --set optimizer.params.lr=1e-4)", text));
  return {text.substr(0, eq), text.substr(eq + 1)};
}

std::vector<ConfigOverride> parse_config_overrides(const std::vector<std::string>& texts) {
  std::vector<ConfigOverride> out;
  for (const auto& t : texts) out.push_back(parse_config_override(t));
  return out;
}

void apply_config_overrides(json& j, const std::vector<ConfigOverride>& overrides) {
  for (const auto& o : overrides) {
    const auto parts = split_path(o);
    json* at = &j;
    std::string walked = "the top level";
    for (size_t i = 0;; ++i) {
      if (!at->is_object())
        throw ConfigError(
            fmt::format("--set {}={}: {} is not an object in the config", o.path, o.value, walked));
      if (i + 1 == parts.size()) break;
      walked = i == 0 ? parts[0] : walked + "." + parts[i];
      at = &(*at)[parts[i]];
      if (at->is_null()) *at = json::object();
    }
    (*at)[parts.back()] = override_value(o.value);
  }
}

}  // namespace dsactor::trainer
