#pragma once
// The fixed slots of a same-host shared-memory arena a client mapped with a service, and
// which pages each keeps between uses. One pool may serve several clients of the same
// service and key (a trainer's fetch and push clients): a slot a block's parameters free
// then takes the next gradient or fetch of its size with its pages still resident.
// Thread-safe: a slot may be taken and filled on one thread and sent, then released, on
// another.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace dsactor::messages {
class SharedArena;
}

namespace dsactor::actors {

class SlotPool;

// Which pages a pool's slots keep between uses. A slot keeps what a use touched when that
// use touched at most `per_slot` bytes and the pool's kept pages stay within `pool` bytes;
// otherwise the slot gives back all of its pages when released: a large payload costs its
// memory only while it is in flight (as a frame would), and a slot the pool touched beyond
// its steady state (a push queued behind another while the service falls behind) lends
// its pages for that use only, instead of holding them for the rest of the run.
struct SlotKeep {
  size_t per_slot = SIZE_MAX;
  size_t pool = SIZE_MAX;
};

// One slot of a pool, held: writable bytes the caller fills for a push (or a fetch reply
// was written to). Returns the slot when destroyed; must not outlive the clients that use
// its pool. Move-only.
class ArenaBuffer {
 public:
  ArenaBuffer() = default;
  ArenaBuffer(ArenaBuffer&& o) noexcept;
  ArenaBuffer& operator=(ArenaBuffer&& o) noexcept;
  ~ArenaBuffer();
  explicit operator bool() const { return pool_ != nullptr; }
  // The whole slot (at least the size asked for).
  std::span<std::byte> bytes() const { return bytes_; }
  uint64_t offset() const { return offset_; }
  // The leading bytes an earlier use may have written: past them the slot reads zeros
  // (its pages were never touched, or given back), so a caller that needs zeros clears
  // only these.
  size_t dirty_bytes() const { return dirty_bytes_; }
  // memcpy(bytes().data(), src, n) that keeps the crc32c of those n bytes, taken from
  // `src` as they are copied (one pass over memory): a push from this slot declares it
  // instead of reading the slot again. A later write into the slot spoils only that push
  // (the service refuses it: checksumMismatch), never the service's memory.
  void copy_in(const void* src, size_t n);

 private:
  friend class SlotPool;
  friend class OffloadClient;
  void release();
  // The bytes copy_in wrote at the slot's start and their crc32c.
  std::optional<std::pair<size_t, uint32_t>> copied_;
  SlotPool* pool_ = nullptr;
  size_t slot_ = 0;
  uint64_t offset_ = 0;
  std::span<std::byte> bytes_;
  size_t dirty_bytes_ = 0;
};

class SlotPool {
 public:
  // `slots` slots of `slot_bytes` (page-aligned) over `arena`, which the service knows as
  // `arena_id`, keeping pages as `keep` says.
  SlotPool(std::unique_ptr<messages::SharedArena> arena, uint64_t arena_id, size_t slot_bytes,
           size_t slots, SlotKeep keep);
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  uint64_t arena_id() const { return arena_id_; }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t arena_bytes() const;
  // A free slot for a use of `fit_bytes`, taken as touched up to `used_bytes`; empty when
  // the use is larger than a slot or every slot is taken. Of the free slots, one whose kept
  // pages cover the use but not twice over (the smallest such), else the one that kept the
  // most short of it: a slot's pages serve the same payload size step after step.
  ArenaBuffer take(size_t fit_bytes, size_t used_bytes);
  // What the current use of a taken slot touched (a fetch's reply says).
  void set_used(size_t slot, size_t bytes);
  // Gives back the pages free slots kept (MADV_REMOVE, for the service's mapping too).
  // Returns the bytes given back.
  size_t trim_free();
  // Bytes of slot pages resident now: kept by free slots and held by taken ones.
  size_t resident_bytes() const;
  // The bound on the pages slots keep between uses (SlotKeep::pool, whole pages).
  size_t keep_limit_bytes() const { return keep_pool_; }
  // Bytes of slot pages faulted in so far: each use's bytes beyond what its slot had kept
  // (counted when the slot is released).
  uint64_t faulted_bytes() const;
  // The most bytes free slots kept at once: memory the pool held beyond what its users did.
  size_t peak_idle_bytes() const;

 private:
  friend class ArenaBuffer;
  void release(size_t slot);
  size_t pick(size_t bytes) const;  // slot_busy_.size(): none free

  std::unique_ptr<messages::SharedArena> arena_;
  uint64_t arena_id_;
  size_t slot_bytes_;
  size_t keep_slot_;       // SlotKeep::per_slot, at most a slot
  size_t keep_pool_;       // SlotKeep::pool
  size_t kept_bytes_ = 0;  // the sum of slot_resident_ over all slots, free and taken
  mutable std::mutex mu_;
  std::vector<char> slot_busy_;
  std::vector<size_t> slot_used_;      // bytes the current use of each slot may have touched
  std::vector<size_t> slot_resident_;  // bytes a free slot kept from its uses (up to keep)
  uint64_t faulted_bytes_ = 0;
  size_t idle_bytes_ = 0;  // the sum of slot_resident_ over free slots
  size_t peak_idle_bytes_ = 0;
};

}  // namespace dsactor::actors
