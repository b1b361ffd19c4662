#pragma once
// Internal to trainer/config: what parsing a ds_config shares between the walk over the
// JSON tree (ds_config_parse.cpp) and the rules that span several keys (ds_config_rules.cpp).
#include <map>
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "key_table/key_spec.h"
#include "trainer/config/ds_config.h"

namespace dsactor::trainer::ds_config_detail {

struct ParseState {
  const std::string& source;
  DsConfig& cfg;
  std::set<std::string, std::less<>> present;                  // canonical paths the file gives
  std::map<std::string, key_table::Value, std::less<>> given;  // canonical path -> value

  bool has(std::string_view path) const { return present.count(path) > 0; }
  // ConfigError("<source>: <path>: <problem>").
  [[noreturn]] void fail(std::string_view path, const std::string& problem) const;
};

// Every key's table default into `cfg` (keys without one keep the member initializer).
void apply_defaults(DsConfig& cfg);
// Walks the top-level object: unknown keys, types, ranges, aliases and deprecated spellings;
// stores every value through its row's setter and records it in `state`.
void read_keys(ParseState& state, const nlohmann::json& top);
// The rules beyond single keys, in DeepSpeed's order: the batch triple, the optimizer and
// scheduler sections, ZeRO's derived values and deprecated booleans, precision and wandb.
void apply_rules(ParseState& state);

}  // namespace dsactor::trainer::ds_config_detail
