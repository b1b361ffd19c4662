// ds_config files: JSON (duplicate keys refused, as DeepSpeed's loader does) and YAML,
// turned into the JSON tree parse_ds_config reads.
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include "key_table/key_suggestion.h"
#include "trainer/config/ds_config.h"

namespace dsactor::trainer {
namespace {

using json = nlohmann::json;

bool all_digits(std::string_view s, int base) {
  if (s.empty()) return false;
  for (char ch : s) {
    const bool ok = base == 16  ? std::isxdigit(static_cast<unsigned char>(ch)) != 0
                    : base == 8 ? ch >= '0' && ch <= '7'
                                : ch >= '0' && ch <= '9';
    if (!ok) return false;
  }
  return true;
}

// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?, the YAML 1.2 core float (so 2e8 is one).
bool is_yaml_float(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t b = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i - b;
  };
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  const size_t int_digits = digits();
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    frac_digits = digits();
  }
  if (int_digits == 0 && frac_digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

// YAML 1.2 core-schema typing of a plain (unquoted) scalar.
json yaml_scalar(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  const std::string_view unsigned_part =
      !s.empty() && (s[0] == '+' || s[0] == '-') ? std::string_view(s).substr(1) : s;
  try {
    if (all_digits(unsigned_part, 10)) return std::stoll(s);
    if (s.rfind("0x", 0) == 0 && all_digits(std::string_view(s).substr(2), 16))
      return std::stoll(s.substr(2), nullptr, 16);
    if (s.rfind("0o", 0) == 0 && all_digits(std::string_view(s).substr(2), 8))
      return std::stoll(s.substr(2), nullptr, 8);
  } catch (const std::out_of_range&) {
    return std::stod(s);  // beyond int64: keep it as a number; range checks report it
  }
  if (is_yaml_float(s)) return std::stod(s);
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf")
    return std::numeric_limits<double>::infinity();
  if (s == "-.inf" || s == "-.Inf" || s == "-.INF") return -std::numeric_limits<double>::infinity();
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return std::numeric_limits<double>::quiet_NaN();
  return s;
}

json yaml_to_json(const YAML::Node& n, const std::string& source) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      // Quoted scalars carry the "!" tag and stay strings.
      return n.Tag() == "!" ? json(n.Scalar()) : yaml_scalar(n.Scalar());
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& e : n) a.push_back(yaml_to_json(e, source));
      return a;
    }
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) {
        const auto key = kv.first.as<std::string>();
        if (o.contains(key))
          throw ConfigError(
              fmt::format("{}:{}: duplicate key \"{}\"", source, kv.first.Mark().line + 1, key));
        o[key] = yaml_to_json(kv.second, source);
      }
      return o;
    }
  }
  return nullptr;
}

// DeepSpeed loads JSON with a hook that rejects duplicate keys; so do we.
json parse_json_text(const std::string& text, const std::string& source) {
  std::vector<std::set<std::string>> keys;
  std::string dup;
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) keys.emplace_back();
    if (ev == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (ev == json::parse_event_t::key && !keys.empty() && dup.empty()) {
      const auto k = parsed.get<std::string>();
      if (!keys.back().insert(k).second) dup = k;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, cb);
  } catch (const json::parse_error& e) {
    throw ConfigError(fmt::format("{}: invalid JSON: {}", source, e.what()));
  }
  if (!dup.empty()) throw ConfigError(fmt::format("{}: duplicate key \"{}\"", source, dup));
  return j;
}

}  // namespace

nlohmann::json yaml_text_to_json(const std::string& yaml_text, const std::string& source) {
  try {
    return yaml_to_json(YAML::Load(yaml_text), source);
  } catch (const YAML::Exception& e) {
    // Also covers non-scalar map keys, which have no JSON equivalent.
    throw ConfigError(fmt::format("{}:{}:{}: invalid YAML: {}", source, e.mark.line + 1,
                                  e.mark.column + 1, e.msg));
  }
}

DsConfig load_ds_config(const std::filesystem::path& file, int world_size,
                        const std::vector<ConfigOverride>& overrides) {
  const std::string source = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open the DeepSpeed config file", source));
  std::stringstream buf;
  buf << in.rdbuf();
  const auto ext = key_table::lower(file.extension().string());
  json j;
  if (ext == ".json") {
    j = parse_json_text(buf.str(), source);
  } else if (ext == ".yaml" || ext == ".yml") {
    j = yaml_text_to_json(buf.str(), source);
  } else {
    throw ConfigError(fmt::format(
        "{}: unknown config file extension \"{}\"; allowed: .json, .yaml, .yml", source, ext));
  }
  apply_config_overrides(j, overrides);
  DsConfig cfg =
      parse_ds_config(j, overrides.empty() ? source : source + " with --set", world_size);
  for (const auto& w : cfg.warnings) spdlog::warn("{}", w);
  for (const auto& w : cfg.no_effect) spdlog::warn("{}", w);
  return cfg;
}

}  // namespace dsactor::trainer
