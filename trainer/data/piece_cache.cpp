#include "trainer/data/piece_cache.h"

namespace dsactor::trainer {

void PieceCache::place(const Slot& slot) {
  size_t i = slot.hash & (slots_.size() - 1);
  while (slots_[i].ids_count != 0) i = (i + 1) & (slots_.size() - 1);
  slots_[i] = slot;
}

void PieceCache::insert(std::string_view piece, uint64_t h, std::span<const int32_t> ids) {
  if (ids.empty()) return;
  if (ids_.size() + ids.size() > max_ids_) {
    slots_.assign(kInitialSlots, Slot{});
    keys_.clear();
    ids_.clear();
    used_ = 0;
  }
  if (2 * (used_ + 1) > slots_.size()) {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old)
      if (s.ids_count != 0) place(s);
  }
  place({h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(piece.size()),
         static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(ids.size())});
  keys_.append(piece);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  ++used_;
}

}  // namespace dsactor::trainer
