#pragma once
// Internal to trainer/config: what parsing a ds_config shares between the walk over the
// JSON tree (ds_config_parse.cpp), the problems it collects (ds_config_problems.cpp) and
// the rules that span several keys (ds_config_rules.cpp).
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "key_table/key_spec.h"
#include "trainer/config/ds_config.h"

namespace dsactor::trainer::ds_config_detail {

// The words every refusal of a DeepSpeed feature uses, so a user can tell it from a typo
// ("unknown key").
inline constexpr std::string_view kUnsupportedFeature =
    "a DeepSpeed feature that dsactor does not support";

struct ParseState {
  ParseState(const std::string& source_, DsConfig& cfg_) : source(source_), cfg(cfg_) {}

  const std::string& source;
  DsConfig& cfg;
  std::set<std::string, std::less<>> present;                  // canonical paths the file gives
  std::map<std::string, key_table::Value, std::less<>> given;  // canonical path -> value
  // Problems reported together, one line each, once the walk is done: keys whose value is
  // the Hugging Face placeholder "auto" (canonical path -> what is allowed), and DeepSpeed
  // features dsactor does not implement ("path: ...").
  std::map<std::string, std::string, std::less<>> autos;
  std::vector<std::string> unsupported;
  // "zero_optimization": true / false, DeepSpeed's deprecated form of the section.
  std::optional<bool> zero_optimization_flag;

  bool has(std::string_view path) const { return present.count(path) > 0; }
  // ConfigError("<source>: <path>: <problem>").
  [[noreturn]] void fail(std::string_view path, const std::string& problem) const;
};

// Every key's table default into `cfg` (keys without one keep the member initializer).
void apply_defaults(DsConfig& cfg);
// Walks the top-level object: unknown keys, types, ranges, aliases and deprecated spellings;
// stores every value through its row's setter and records it in `state`. "auto" values and
// unsupported features are collected in `state`, not thrown.
void read_keys(ParseState& state, const nlohmann::json& top);
// The collected problems as one ConfigError listing every one of them (unsupported
// features first, then the "auto" keys, each on its own line); nothing when there are none.
// The batch keys given as "auto" are dropped first when DeepSpeed's batch rule can derive
// them from the ones given.
void report_collected(ParseState& state);
// The rules beyond single keys, in DeepSpeed's order: the batch triple, the optimizer and
// scheduler sections, ZeRO's derived values and deprecated booleans, precision.
void apply_rules(ParseState& state);

}  // namespace dsactor::trainer::ds_config_detail
