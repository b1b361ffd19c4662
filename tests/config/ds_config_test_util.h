#pragma once
// What the ds_config tests share: the error a config gets, as text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "trainer/config/ds_config.h"

namespace dsactor::trainer {

// The ConfigError's text for `j` read as if from `source`; a test failure when it parses.
inline std::string config_error_of(const nlohmann::json& j, const char* source,
                                   int world_size = 1) {
  try {
    parse_ds_config(j, source, world_size);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for " << j.dump();
  return "";
}

}  // namespace dsactor::trainer
