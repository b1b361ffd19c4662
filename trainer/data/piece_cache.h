#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsactor::trainer {

// BPE's word cache: piece bytes -> the ids they merge into. Open addressing over one slot
// array (linear probing, at most half full), keys and ids packed in two flat buffers, so a
// hit costs one hash and one compare and an insert allocates nothing per entry. (libstdc++
// 12's heterogeneous unordered_map::find, the obvious alternative, took 9x a plain lookup.)
// Bounded: when the ids would pass max_ids, everything is dropped and filling starts over.
class PieceCache {
 public:
  explicit PieceCache(size_t max_ids) : max_ids_(max_ids) { slots_.resize(kInitialSlots); }

  static uint64_t hash(std::string_view piece) { return std::hash<std::string_view>{}(piece); }

  // The cached ids of `piece` (with `h` == hash(piece)); empty when it is not cached.
  std::span<const int32_t> find(std::string_view piece, uint64_t h) const {
    for (size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& s = slots_[i];
      if (s.ids_count == 0) return {};
      if (s.hash == h && s.key_size == piece.size() &&
          std::string_view(keys_).substr(s.key_offset, s.key_size) == piece)
        return {ids_.data() + s.ids_offset, s.ids_count};
    }
  }

  // Adds `piece` (not cached yet) with its non-empty `ids`.
  void insert(std::string_view piece, uint64_t h, std::span<const int32_t> ids);

  size_t size() const { return used_; }

 private:
  static constexpr size_t kInitialSlots = 1 << 12;
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0, key_size = 0, ids_offset = 0, ids_count = 0;  // count 0: empty
  };
  void place(const Slot& slot);

  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t used_ = 0;
  size_t max_ids_;
};

}  // namespace dsactor::trainer
