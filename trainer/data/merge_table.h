#pragma once

#include <cstdint>
#include <vector>

namespace dsactor::trainer {

// BPE's merge ranks: (left id, right id) -> (rank, merged id), looked up for every adjacent
// pair of a piece the word cache has not seen. One flat array, open addressing with linear
// probing at most half full, Fibonacci hashing of the pair: a lookup is about one cache
// line, where a node-based unordered_map was a fifth of a cold encoding pass.
class MergeTable {
 public:
  struct Merge {
    uint32_t rank;
    int32_t merged;
  };

  explicit MergeTable(size_t merges) {
    size_t n = 16;
    while (n < 2 * merges) n *= 2;
    slots_.assign(n, Slot{kEmpty, {}});
    shift_ = 64 - __builtin_ctzll(n);
  }

  // Sets (or, for a pair already present, replaces) the pair's merge.
  void set(int32_t left, int32_t right, Merge m) {
    const uint64_t key = pair_key(left, right);
    size_t i = index(key);
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = {key, m};
  }

  const Merge* find(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (size_t i = index(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are below 2^31: never a pair
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  size_t index(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }

  std::vector<Slot> slots_;
  int shift_ = 0;
};

}  // namespace dsactor::trainer
