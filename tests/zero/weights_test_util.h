#pragma once
// Comparing two runs' final weights (safetensors files of F32 tensors): the largest
// absolute element difference, with a gtest failure for a tensor missing or of another
// size on one side.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "storage/safetensors.h"

namespace dsactor::testing {

inline float max_weight_difference(const std::filesystem::path& x, const std::filesystem::path& y) {
  const auto a = storage::read_safetensors(x), b = storage::read_safetensors(y);
  EXPECT_EQ(a.tensors.size(), b.tensors.size()) << x << " vs " << y;
  float worst = 0;
  for (const auto& [name, t] : a.tensors) {
    const auto it = b.tensors.find(name);
    if (it == b.tensors.end()) {
      ADD_FAILURE() << name << " is missing from " << y;
      continue;
    }
    const auto& u = it->second.bytes;
    EXPECT_EQ(t.bytes.size(), u.size()) << name;
    for (size_t i = 0; i < std::min(t.bytes.size(), u.size()) / 4; ++i) {
      float p, q;
      std::memcpy(&p, t.bytes.data() + 4 * i, 4);
      std::memcpy(&q, u.data() + 4 * i, 4);
      worst = std::max(worst, std::abs(p - q));
    }
  }
  return worst;
}

}  // namespace dsactor::testing
