#include "deploy/deploy_yaml.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

#include "deploy/deploy_keys.h"
#include "key_table/byte_size.h"
#include "key_table/key_error.h"
#include "key_table/key_path.h"

namespace dsactor::deploy {

namespace fs = std::filesystem;

namespace {

bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

bool valid_env_name(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

}  // namespace

DeployYaml::DeployYaml(fs::path source)
    : source_(std::move(source)),
      base_dir_(source_.has_parent_path() ? source_.parent_path() : fs::current_path()) {}

void DeployYaml::fail(const YAML::Node& at, std::string_view path,
                      const std::string& problem) const {
  const YAML::Mark m = at.IsDefined() ? at.Mark() : YAML::Mark::null_mark();
  const std::string file = source_.string();
  const key_table::Location where{file, m.is_null() ? 0 : m.line + 1};
  throw DeployConfigError(where.message(path, problem));
}

void DeployYaml::not_allowed(const YAML::Node& at, std::string_view path,
                             std::string_view shown) const {
  fail(at, path, key_table::not_allowed_problem(spec(path), shown));
}

const key_table::KeySpec& DeployYaml::spec(std::string_view path) const {
  const auto* s = deploy_key_table().find(path);
  if (!s) throw std::logic_error(fmt::format("deploy key table has no row for {}", path));
  return *s;
}

std::string DeployYaml::shown(const YAML::Node& n) {
  if (n.IsScalar()) return fmt::format("\"{}\"", n.Scalar());
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "nothing";
}

void DeployYaml::check_keys(const YAML::Node& map, std::string_view parent,
                            std::optional<RoleKind> kind) const {
  const auto& table = deploy_key_table();
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) fail(kv.first, parent, "keys must be strings");
    const std::string key = kv.first.Scalar();
    const std::string path = key_table::join_path(parent, key);
    const auto* s = table.child(parent, key);
    if (!s) fail(kv.first, path, table.unknown_key_problem(parent, key));
    if (kind && !table.applies(*s, role_index(*kind)))
      fail(kv.first, path, table.not_applicable_problem(*s, role_index(*kind)));
  }
}

std::string DeployYaml::string(const YAML::Node& n, std::string_view path) const {
  if (!n.IsScalar()) fail(n, path, key_table::expected_problem(spec(path), shown(n)));
  return n.Scalar();
}

bool DeployYaml::boolean(const YAML::Node& n, std::string_view path) const {
  bool b = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, b))
    fail(n, path, key_table::expected_problem(spec(path), shown(n)));
  return b;
}

int64_t DeployYaml::integer(const YAML::Node& n, std::string_view path) const {
  return integer(n, path, spec(path).range());
}

int64_t DeployYaml::integer(const YAML::Node& n, std::string_view path,
                            const key_table::Range& range) const {
  int64_t v = 0;
  if (n.IsScalar()) {
    const std::string& s = n.Scalar();
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size() && range.contains(static_cast<double>(v)))
      return v;
  }
  fail(n, path, key_table::not_allowed_problem(spec(path), shown(n), range));
}

double DeployYaml::seconds(const YAML::Node& n, std::string_view path) const {
  const auto& s = spec(path);
  if (n.IsScalar()) {
    const std::string& text = n.Scalar();
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (!text.empty() && end == text.c_str() + text.size() && std::isfinite(v) &&
        s.range().contains(v))
      return v;
  }
  fail(n, path, key_table::not_allowed_problem(s, shown(n)));
}

uint64_t DeployYaml::bytes(const YAML::Node& n, std::string_view path) const {
  if (n.IsScalar())
    if (auto v = key_table::parse_byte_size(n.Scalar())) return *v;
  fail(n, path,
       fmt::format("value {} is not a byte count; {}", shown(n), key_table::kByteSizeSyntax));
}

fs::path DeployYaml::resolve(const std::string& p) const {
  fs::path path(p);
  if (!p.empty() && p[0] == '~')
    if (const char* home = std::getenv("HOME"))
      path = fs::path(home) / p.substr(p.size() > 1 ? 2 : 1);
  return (path.is_absolute() ? path : base_dir_ / path).lexically_normal();
}

fs::path DeployYaml::path(const YAML::Node& n, std::string_view key_path) const {
  return resolve(string(n, key_path));
}

EnvList DeployYaml::env(const YAML::Node& n, std::string_view path) const {
  if (!n.IsMap()) fail(n, path, key_table::expected_problem(spec(path), shown(n)));
  EnvList out;
  for (const auto& kv : n) {
    const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : std::string();
    if (!valid_env_name(name))
      fail(kv.first, path,
           fmt::format("environment name {} is not allowed; expected [A-Za-z_][A-Za-z0-9_]*",
                       shown(kv.first)));
    if (!kv.second.IsScalar())
      fail(kv.second, key_table::join_path(path, name),
           fmt::format("expected a string value, got {}", shown(kv.second)));
    out.emplace_back(name, kv.second.Scalar());
  }
  return out;
}

namespace {

// A list item as JSON text: numbers, true/false and null as written, anything else quoted.
std::string json_item(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  const bool number = !s.empty() && end == s.c_str() + s.size();
  if (number || s == "true" || s == "false" || s == "null") return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

}  // namespace

std::vector<std::pair<std::string, std::string>> DeployYaml::config_overrides(
    const YAML::Node& n, std::string_view path) const {
  if (!n.IsMap()) fail(n, path, key_table::expected_problem(spec(path), shown(n)));
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& kv : n) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : std::string();
    if (key.empty() || key.find_first_of(" =") != std::string::npos)
      fail(kv.first, path,
           fmt::format("key {} is not a ds_config key path; expected one like "
                       "optimizer.params.lr",
                       shown(kv.first)));
    const YAML::Node& v = kv.second;
    std::string text;
    if (v.IsScalar()) {
      text = v.Scalar();
    } else if (v.IsSequence()) {
      std::vector<std::string> items;
      for (const auto& e : v) {
        if (!e.IsScalar())
          fail(e, key_table::join_path(path, key), "expected a list of numbers or strings");
        items.push_back(json_item(e.Scalar()));
      }
      text = fmt::format("[{}]", fmt::join(items, ", "));
    } else {
      fail(v, key_table::join_path(path, key),
           fmt::format("expected a value or a list, got {}; give nested keys as dotted paths "
                       "(optimizer.params.lr: 1e-4)",
                       shown(v)));
    }
    out.emplace_back(key, text);
  }
  return out;
}

std::string DeployYaml::choice(const YAML::Node& n, std::string_view path) const {
  const auto& s = spec(path);
  const std::string text = string(n, path);
  const auto matched = key_table::match_choice(s, text);
  if (!matched) fail(n, path, key_table::choice_problem(s, text));
  return std::string(*matched);
}

RoleKind DeployYaml::role_kind(const YAML::Node& entry, std::string_view entry_path) const {
  const std::string path = key_table::join_path(entry_path, "role");
  const auto& s = spec(path);
  const YAML::Node n = entry["role"];
  if (!n)
    fail(entry, path,
         fmt::format("missing; every entry of roles needs role: {}", key_table::allowed_text(s)));
  const std::string kind = choice(n, path);
  for (const auto k : {RoleKind::kOffload, RoleKind::kTrainer, RoleKind::kCoordinator})
    if (role_kind_name(k) == kind) return k;
  throw std::logic_error("deploy key table: a role choice without a RoleKind");
}

std::string DeployYaml::name(const YAML::Node& n, std::string_view path, std::string value) const {
  if (!valid_name(value)) not_allowed(n, path, fmt::format("\"{}\"", value));
  return value;
}

}  // namespace dsactor::deploy
