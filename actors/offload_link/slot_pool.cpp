#include "actors/offload_link/slot_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "checksum/crc32c_copy.h"
#include "messages/shm_arena.h"

namespace dsactor::actors {

namespace {
constexpr size_t kPage = 4096;
size_t whole_pages(size_t bytes) {
  return (bytes + kPage - 1) / kPage * kPage;
}
}  // namespace

ArenaBuffer::ArenaBuffer(ArenaBuffer&& o) noexcept
    : copied_(std::exchange(o.copied_, std::nullopt)),
      pool_(std::exchange(o.pool_, nullptr)),
      slot_(o.slot_),
      offset_(o.offset_),
      bytes_(o.bytes_),
      dirty_bytes_(o.dirty_bytes_) {}

ArenaBuffer& ArenaBuffer::operator=(ArenaBuffer&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::exchange(o.pool_, nullptr);
    slot_ = o.slot_;
    offset_ = o.offset_;
    bytes_ = o.bytes_;
    dirty_bytes_ = o.dirty_bytes_;
    copied_ = std::exchange(o.copied_, std::nullopt);
  }
  return *this;
}

ArenaBuffer::~ArenaBuffer() {
  release();
}

void ArenaBuffer::release() {
  if (pool_) pool_->release(slot_);
  pool_ = nullptr;
  copied_.reset();
}

void ArenaBuffer::copy_in(const void* src, size_t n) {
  if (n > bytes_.size())
    throw std::invalid_argument("ArenaBuffer::copy_in: " + std::to_string(n) +
                                " bytes do not fit a slot of " + std::to_string(bytes_.size()));
  copied_ = std::pair{n, checksum::crc32c_copy(bytes_.data(), src, n)};
}

SlotPool::SlotPool(std::unique_ptr<messages::SharedArena> arena, uint64_t arena_id,
                   size_t slot_bytes, size_t slots, SlotKeep keep)
    : arena_(std::move(arena)),
      arena_id_(arena_id),
      slot_bytes_(slot_bytes),
      // Compared before rounding up: either may be SIZE_MAX ("keep everything").
      keep_slot_(keep.per_slot >= slot_bytes ? slot_bytes : whole_pages(keep.per_slot)),
      keep_pool_(keep.pool >= slot_bytes * slots ? slot_bytes * slots : whole_pages(keep.pool)),
      slot_busy_(slots, 0),
      slot_used_(slots, 0),
      slot_resident_(slots, 0) {}

SlotPool::~SlotPool() = default;

size_t SlotPool::arena_bytes() const {
  return arena_->size();
}

void SlotPool::release(size_t slot) {
  std::lock_guard lock(mu_);
  slot_busy_[slot] = 0;
  const size_t used = std::exchange(slot_used_[slot], 0);
  size_t& resident = slot_resident_[slot];
  if (used > resident) faulted_bytes_ += used - resident;
  // Pages are counted whole: a page a use touched at all is resident.
  const size_t kept = std::max(resident, whole_pages(used));
  if (used <= keep_slot_ && kept_bytes_ - resident + kept <= keep_pool_) {
    kept_bytes_ += kept - resident;
    resident = kept;
    idle_bytes_ += resident;
    peak_idle_bytes_ = std::max(peak_idle_bytes_, idle_bytes_);
    return;
  }
  // Kept, these pages would sit idle through the memory peaks between their uses: a large
  // payload is rare, and a slot beyond the pool's bound was taken only because the usual
  // ones were all in flight. MADV_REMOVE frees the memfd's pages (for the service's mapping
  // too); they read back as zeros and are faulted in again by the next use that needs them.
  madvise(arena_->data() + slot * slot_bytes_, std::min(slot_bytes_, kept), MADV_REMOVE);
  kept_bytes_ -= resident;
  resident = 0;
}

void SlotPool::set_used(size_t slot, size_t bytes) {
  std::lock_guard lock(mu_);
  slot_used_[slot] = bytes;
}

size_t SlotPool::trim_free() {
  std::lock_guard lock(mu_);
  size_t given = 0;
  for (size_t i = 0; i < slot_busy_.size(); ++i) {
    if (slot_busy_[i] || slot_resident_[i] == 0) continue;
    madvise(arena_->data() + i * slot_bytes_, slot_resident_[i], MADV_REMOVE);
    given += slot_resident_[i];
    idle_bytes_ -= slot_resident_[i];
    kept_bytes_ -= slot_resident_[i];
    slot_resident_[i] = 0;
  }
  return given;
}

size_t SlotPool::pick(size_t bytes) const {
  // A free slot whose kept pages fit the use, less than twice its size (the smallest such):
  // the embedding's slot stays the embedding's, a layer's goes to a layer. Else one that
  // kept less than the use, the most of it (the fewest faulted in): a layer that took the
  // embedding's kept pages would leave the embedding to fault in a slot of its own. Only
  // when every free slot kept twice the use or more, the smallest of them.
  // Kept pages are counted whole: so is the use.
  bytes = whole_pages(bytes);
  const size_t none = slot_busy_.size();
  size_t fit = none, under = none, over = none;
  for (size_t i = 0; i < slot_busy_.size(); ++i) {
    if (slot_busy_[i]) continue;
    const size_t r = slot_resident_[i];
    if (r >= bytes && r / 2 < bytes) {
      if (fit == none || r < slot_resident_[fit]) fit = i;
    } else if (r < bytes) {
      if (under == none || r > slot_resident_[under]) under = i;
    } else if (over == none || r < slot_resident_[over]) {
      over = i;
    }
  }
  return fit != none ? fit : under != none ? under : over;
}

ArenaBuffer SlotPool::take(size_t fit_bytes, size_t used_bytes) {
  ArenaBuffer b;
  if (fit_bytes > slot_bytes_) return b;
  std::lock_guard lock(mu_);
  const size_t i = pick(fit_bytes);
  if (i == slot_busy_.size()) return b;
  slot_busy_[i] = 1;
  slot_used_[i] = used_bytes;
  b.pool_ = this;
  b.slot_ = i;
  b.offset_ = i * slot_bytes_;
  b.bytes_ = {arena_->data() + b.offset_, slot_bytes_};
  b.dirty_bytes_ = slot_resident_[i];
  idle_bytes_ -= slot_resident_[i];
  return b;
}

size_t SlotPool::resident_bytes() const {
  std::lock_guard lock(mu_);
  size_t sum = 0;
  for (size_t i = 0; i < slot_resident_.size(); ++i)
    sum += std::max(slot_resident_[i], slot_busy_[i] ? slot_used_[i] : 0);
  return sum;
}

uint64_t SlotPool::faulted_bytes() const {
  std::lock_guard lock(mu_);
  return faulted_bytes_;
}

size_t SlotPool::peak_idle_bytes() const {
  std::lock_guard lock(mu_);
  return peak_idle_bytes_;
}

}  // namespace dsactor::actors
