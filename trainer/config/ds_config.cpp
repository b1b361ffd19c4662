#include "trainer/config/ds_config.h"

#include <fmt/format.h>

#include "trainer/config/ds_config_parse.h"

namespace dsactor::trainer {

const char* to_string(OptimizerType t) {
  switch (t) {
    case OptimizerType::kAdamW:
      return "AdamW";
    case OptimizerType::kLamb:
      return "Lamb";
    case OptimizerType::kAdam:
      break;
  }
  return "Adam";
}
const char* to_string(SchedulerType t) {
  switch (t) {
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
    case SchedulerType::kOneCycle:
      return "OneCycle";
    case SchedulerType::kLRRangeTest:
      return "LRRangeTest";
    case SchedulerType::kNone:
      break;
  }
  return "none";
}
const char* to_string(OffloadDevice d) {
  return d == OffloadDevice::kCpu ? "cpu" : d == OffloadDevice::kNvme ? "nvme" : "none";
}

DsConfig parse_ds_config(const nlohmann::json& j, const std::string& source, int world_size) {
  DsConfig cfg;
  cfg.source = source;
  if (world_size < 1)
    throw ConfigError(
        fmt::format("{}: world_size {} is invalid; it must be >= 1", source, world_size));
  cfg.world_size = world_size;
  ds_config_detail::apply_defaults(cfg);
  ds_config_detail::ParseState state(source, cfg);
  ds_config_detail::read_keys(state, j);
  ds_config_detail::report_collected(state);
  ds_config_detail::apply_rules(state);
  return cfg;
}

}  // namespace dsactor::trainer
