#pragma once
// Internal to trainer/config: the ds_config key table (ds_config_keys.cpp). One row per key
// the parser reads, in reference-page order: the engine's KeySpec (key_table/) and how a
// value of the key is stored into DsConfig.
#include <vector>

#include "key_table/key_table.h"
#include "trainer/config/ds_config.h"

namespace dsactor::trainer::ds_config_detail {

using key_table::Value;
using Setter = void (*)(DsConfig&, const Value&);

struct DsKey {
  key_table::KeySpec key;
  Setter set = nullptr;  // null for objects and for keys the rules read from the parse state
};

const std::vector<DsKey>& ds_keys();
// The engine's view of ds_keys(); its applicabilities name the scheduler types and the
// optimizer types (scheduler.params and optimizer.params keys apply to some types only).
const key_table::KeyTable& ds_key_table();
// The row of ds_keys() behind a KeySpec of ds_key_table().
const DsKey& ds_key(const key_table::KeySpec& spec);
// The bit of `type` in KeySpec::applies_to (type != kNone).
size_t scheduler_index(SchedulerType type);
size_t optimizer_index(OptimizerType type);

}  // namespace dsactor::trainer::ds_config_detail
