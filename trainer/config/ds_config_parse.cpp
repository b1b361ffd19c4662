// The walk over a ds_config's JSON tree: every key is looked up in the key table
// (ds_config_keys.cpp), its value checked against the row and stored through the row's
// setter. "auto" values and DeepSpeed features dsactor lacks are collected, not thrown
// (ds_config_problems.cpp reports them together); the rules that span several keys are in
// ds_config_rules.cpp.
#include "trainer/config/ds_config_parse.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#include "key_table/key_error.h"
#include "key_table/key_path.h"
#include "key_table/key_suggestion.h"
#include "trainer/config/ds_config_keys.h"

namespace dsactor::trainer::ds_config_detail {
namespace {

using json = nlohmann::json;
using key_table::KeySpec;
using key_table::Support;
using key_table::ValueType;

// A JSON value as messages show it: its dump, cut at 60 characters.
std::string shown(const json& v) {
  std::string d = v.dump();
  if (d.size() > 60) d = d.substr(0, 57) + "...";
  return d;
}

const char* json_type_name(const json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number_float()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "list";
  if (v.is_object()) return "object";
  return "null";
}

bool is_auto(const json& v) {
  return v.is_string() && key_table::lower(v.get<std::string>()) == "auto";
}

// A number written as a string ("1e-4", "8"), as DeepSpeed's pydantic models accept it:
// the whole text must be a finite decimal number.
std::optional<double> numeric_string(const json& v) {
  if (!v.is_string()) return std::nullopt;
  const std::string s = v.get<std::string>();
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0])) ||
      s.find_first_of("xXpP") != std::string::npos)
    return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(x)) return std::nullopt;
  return x;
}

// Reads one leaf value of the JSON tree as its row's type.
class LeafReader {
 public:
  LeafReader(const ParseState& state, const KeySpec& spec, std::string_view place)
      : state_(state), spec_(spec), place_(place) {}

  Value read(const json& v) const {
    if (v.is_null()) {
      if (spec_.nullable) return {};
      fail_type(v);
    }
    switch (spec_.type) {
      case ValueType::kBool:
        if (!v.is_boolean()) fail_type(v);
        return v.get<bool>();
      case ValueType::kInt:
        return integer(v);
      case ValueType::kFloat:
        return in_range(number(v), v);
      case ValueType::kString:
        if (!v.is_string()) fail_type(v);
        return v.get<std::string>();
      case ValueType::kEnum:
        return choice(v);
      case ValueType::kFloatPair:
        return float_pair(v);
      case ValueType::kStringList:
        return string_list(v);
      default:
        break;
    }
    fail_type(v);
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const { state_.fail(place_, problem); }
  [[noreturn]] void fail_type(const json& v) const {
    fail(key_table::expected_problem(spec_, fmt::format("{} {}", json_type_name(v), shown(v))));
  }

  double in_range(double x, const json& shown_value) const {
    if (!spec_.range().contains(x)) fail(key_table::not_allowed_problem(spec_, shown(shown_value)));
    return x;
  }

  double number(const json& v) const {
    if (const auto x = numeric_string(v)) return *x;
    if (!v.is_number()) fail_type(v);
    const double x = v.get<double>();
    if (!std::isfinite(x)) fail_type(v);
    return x;
  }

  int64_t integer(const json& v) const {
    int64_t i = 0;
    if (v.is_number_integer()) {
      i = v.get<int64_t>();
    } else if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(fmt::format("value {} is too large; expected {}", shown(v),
                         key_table::allowed_text(spec_)));
      i = static_cast<int64_t>(v.get<uint64_t>());
    } else if (v.is_number_float() || numeric_string(v)) {
      // DeepSpeed configs write sizes as 2e8, which JSON reads as a float.
      const double x = number(v);
      if (x != std::floor(x) || std::fabs(x) >= 9.2e18)
        fail(fmt::format("value {} is not an integer; expected {}", shown(v),
                         key_table::allowed_text(spec_)));
      i = static_cast<int64_t>(x);
    } else {
      fail_type(v);
    }
    in_range(static_cast<double>(i), v);
    return i;
  }

  std::string choice(const json& v) const {
    if (!v.is_string()) fail_type(v);
    const auto text = v.get<std::string>();
    if (const auto canonical = key_table::match_choice(spec_, text)) return std::string(*canonical);
    fail(key_table::choice_problem(spec_, text));
  }

  std::vector<double> float_pair(const json& v) const {
    if (!v.is_array() || v.size() != 2) fail_type(v);
    std::vector<double> out;
    for (const auto& e : v) out.push_back(in_range(number(e), v));
    return out;
  }

  std::vector<std::string> string_list(const json& v) const {
    if (!v.is_array()) fail_type(v);
    std::vector<std::string> out;
    for (const auto& e : v) {
      if (!e.is_string()) fail_type(v);
      out.push_back(e.get<std::string>());
    }
    return out;
  }

  const ParseState& state_;
  const KeySpec& spec_;
  std::string_view place_;
};

void note_deprecated(ParseState& state, const KeySpec& s) {
  state.cfg.warnings.push_back(fmt::format(
      "{}: {} is deprecated{}{}", state.source, s.path,
      s.alias_of.empty() ? std::string() : fmt::format("; use {}", s.alias_of),
      s.alias_of.empty() || s.doc.empty() ? std::string() : fmt::format(" ({})", s.doc)));
}

std::string note_suffix(const KeySpec& s) {
  return s.support_note.empty() ? std::string() : fmt::format(" ({})", s.support_note);
}

void note_no_effect(ParseState& state, std::string_view place, const KeySpec& s) {
  state.cfg.no_effect.push_back(fmt::format("{}: {}: accepted, has no effect in dsactor{}",
                                            state.source, place, note_suffix(s)));
}

// A section or key of a feature dsactor lacks and whose content it does not read: refused,
// unless it is a section switched off with "enabled": false.
bool switched_off(const json& v);

void given_feature(ParseState& state, std::string_view place, const KeySpec& s, const json& v) {
  if (s.support == Support::kNoEffect) {
    if (!switched_off(v) && !(v.is_object() && v.empty())) note_no_effect(state, place, s);
    return;
  }
  if (switched_off(v)) {
    state.cfg.no_effect.push_back(fmt::format("{}: {}: {}; ignored because enabled is false",
                                              state.source, place, kUnsupportedFeature));
    return;
  }
  state.unsupported.push_back(fmt::format("{}: {}{}", place, kUnsupportedFeature, note_suffix(s)));
}

// A value dsactor reads but does not support (supported_value), or does not act on.
void check_support(ParseState& state, std::string_view place, const KeySpec& s, const Value& v) {
  if (!std::holds_alternative<std::monostate>(s.supported_value) && v != s.supported_value) {
    state.unsupported.push_back(fmt::format(
        "{}: value {} is {} (supported: {}){}", place, key_table::value_text(v, s.type),
        kUnsupportedFeature, key_table::value_text(s.supported_value, s.type), note_suffix(s)));
    return;
  }
  if (s.support == Support::kNoEffect && v != s.def && !std::holds_alternative<std::monostate>(v))
    note_no_effect(state, place, s);
}

bool is_unsupported_choice(const KeySpec& s, const json& v) {
  if (s.type != ValueType::kEnum || !v.is_string()) return false;
  const auto text = key_table::lower(v.get<std::string>());
  for (auto u : s.unsupported)
    if (key_table::lower(u) == text) return true;
  return false;
}

void read_object(ParseState& state, std::string_view parent, std::string_view place,
                 const json& obj);

bool switched_off(const json& v) {
  return v.is_object() && v.contains("enabled") && v.at("enabled") == false;
}

// One key of an object: `s` its row, `place` where the file has it.
void read_key(ParseState& state, const KeySpec& s, const std::string& place, const json& v) {
  const auto& table = ds_key_table();
  const std::string canonical(s.alias_of.empty() ? s.path : s.alias_of);
  const KeySpec& row = s.alias_of.empty() ? s : *table.find(canonical);  // how it is supported
  if (state.has(canonical))
    state.fail(place, fmt::format("gives the same setting as {}, which is also given; keep one of "
                                  "them",
                                  canonical));
  state.present.insert(canonical);
  if (s.deprecated) note_deprecated(state, s);
  const bool has_rows = !table.children(canonical).empty();
  if (!has_rows && (row.support == Support::kUnsupported ||
                    (row.support == Support::kNoEffect && row.type == ValueType::kObject)))
    return given_feature(state, place, row, v);
  if (is_auto(v) && s.type != ValueType::kString) {
    state.autos[canonical] = key_table::allowed_text(s);
    return;
  }
  if (is_unsupported_choice(s, v)) {
    state.unsupported.push_back(fmt::format("{}: value {} is {}; supported: {}", place, shown(v),
                                            kUnsupportedFeature, key_table::allowed_text(s)));
    return;
  }
  if (s.type == ValueType::kObject) {
    if (v.is_null() && s.nullable) return;
    // deepspeed/runtime/zero/config.py, get_zero_config: a boolean section is the old form,
    // read by read_zero_config_deprecated (true = stage 1); ds_config_rules.cpp applies it.
    if (canonical == "zero_optimization" && v.is_boolean()) {
      state.zero_optimization_flag = v.get<bool>();
      return;
    }
    if (!v.is_object())
      state.fail(place,
                 key_table::expected_problem(s, fmt::format("{} {}", json_type_name(v), shown(v))));
    if (row.support == Support::kNoEffect && !v.empty() && !switched_off(v))
      note_no_effect(state, place, row);
    return read_object(state, canonical, place, v);
  }
  Value value = LeafReader(state, s, place).read(v);
  check_support(state, place, row, value);
  if (const auto set = ds_key(s).set) set(state.cfg, value);
  state.given[canonical] = std::move(value);
}

// `parent`: the object's path in the table; `place`: where the file has it (an alias such
// as bfloat16 reads the rows of bf16).
void read_object(ParseState& state, std::string_view parent, std::string_view place,
                 const json& obj) {
  const auto& table = ds_key_table();
  for (const auto& [key, _] : obj.items())
    if (!table.child(parent, key))
      state.fail(key_table::join_path(place, key), table.unknown_key_problem(parent, key));
  for (const auto* s : table.children(parent)) {
    const auto leaf = std::string(key_table::leaf_of(s->path));
    if (obj.contains(leaf)) read_key(state, *s, key_table::join_path(place, leaf), obj.at(leaf));
  }
}

}  // namespace

void ParseState::fail(std::string_view path, const std::string& problem) const {
  throw ConfigError(key_table::Location{source}.message(path, problem));
}

void apply_defaults(DsConfig& cfg) {
  for (const auto& row : ds_keys()) {
    const auto& s = row.key;
    if (!row.set || !s.alias_of.empty() || s.has_children()) continue;
    if (std::holds_alternative<std::monostate>(s.def) && !s.nullable) continue;
    row.set(cfg, s.def);
  }
}

void read_keys(ParseState& state, const nlohmann::json& top) {
  if (!top.is_object())
    throw ConfigError(fmt::format("{}: the top level must be an object, got {}", state.source,
                                  json_type_name(top)));
  read_object(state, "", "", top);
}

}  // namespace dsactor::trainer::ds_config_detail
