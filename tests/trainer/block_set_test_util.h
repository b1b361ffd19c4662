#pragma once
// Bit-for-bit comparison of two BlockSets (weights, gradients, moments), which the engine,
// optimizer, checkpoint and recovery tests all ask.
#include <cstring>

#include "trainer/model/param_blocks.h"

namespace dsactor::trainer {

// Same block count, same sizes, same bytes.
inline bool same_bits(const BlockSet& a, const BlockSet& b) {
  if (a.blocks.size() != b.blocks.size()) return false;
  for (size_t i = 0; i < a.blocks.size(); ++i)
    if (a.blocks[i].bytes() != b.blocks[i].bytes() ||
        std::memcmp(a.blocks[i].data(), b.blocks[i].data(), a.blocks[i].bytes()) != 0)
      return false;
  return true;
}

}  // namespace dsactor::trainer
