#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "storage/aligned_buffer.h"

namespace dsactor::storage {

// Knobs of NvmeFile; the first five map one to one onto DeepSpeed's `aio` block
// (block_size, queue_depth, single_submit, overlap_events) plus its implicit O_DIRECT.
struct NvmeOptions {
  // Bytes per io_uring request. Larger transfers are split into requests of this size.
  // Must be a positive multiple of 4096. Default: 1 MiB (aio.block_size).
  size_t block_size = 1 << 20;

  // Requests kept in flight at once; also the submission ring's size. Must be >= 1.
  // Default: 8 (aio.queue_depth).
  unsigned queue_depth = 8;

  // Enter the kernel once per request instead of once per batch. Only useful to compare
  // with DeepSpeed runs that set it. Default: false (aio.single_submit).
  bool single_submit = false;

  // Refill the queue as each request completes (true), or submit a full batch of
  // queue_depth requests and wait for all of them before the next batch (false).
  // Default: true (aio.overlap_events).
  bool overlap_events = true;

  // Open with O_DIRECT so transfers bypass the page cache and DMA straight into the
  // caller's (aligned) memory. A filesystem that refuses O_DIRECT (EINVAL at open) makes
  // the file fall back to buffered I/O with a logged warning; NvmeFile::mode() says which.
  // Default: true.
  bool use_o_direct = true;

  // With use_o_direct, throw instead of falling back to buffered I/O. Default: false.
  bool require_o_direct = false;

  // Slots for fixed buffers (io_uring_register_buffers). Requests whose memory lies
  // inside a registered buffer use read_fixed/write_fixed, which skips the per-request
  // page pinning. 0 disables fixed buffers. Default: 16.
  unsigned registered_buffers = 16;
};

// A byte range of a file. Extents handed out by ExtentAllocator are 4 KiB aligned in
// offset and size.
struct Extent {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t end() const { return offset + bytes; }
  bool operator==(const Extent&) const = default;
};

enum class IoMode { kDirect, kBuffered };
const char* to_string(IoMode mode);

// Counters since the file was opened.
struct NvmeStats {
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t requests = 0;         // requests submitted, resubmissions included
  uint64_t fixed_requests = 0;   // of which read_fixed/write_fixed
  uint64_t short_transfers = 0;  // completions with fewer bytes than asked (remainder resubmitted)
  uint64_t retries = 0;          // EAGAIN/EINTR completions resubmitted
};

// One preallocated file read and written through one io_uring ring. Every transfer must
// be 4 KiB aligned in file offset, length and memory address, in both I/O modes, so that
// code tested on a buffered fallback also runs under O_DIRECT. A transfer is split into
// block_size requests kept up to queue_depth in flight; short transfers resubmit the
// remainder. Not thread-safe: one owner (the service's nvme_io actor) drives it.
// Errors throw std::runtime_error naming the file, the offset and the errno text.
class NvmeFile {
 public:
  using Ticket = uint64_t;
  static constexpr uint64_t kAlignment = AlignedBuffer::kAlignment;

  // Opens `path`, creating it when missing, and preallocates (fallocate) it to at least
  // `capacity` bytes rounded up to 4 KiB; never shrinks. capacity == 0 keeps an existing
  // file's size (reopen).
  NvmeFile(std::filesystem::path path, uint64_t capacity, const NvmeOptions& options = {});
  // Waits for every outstanding request (their errors are logged, not thrown).
  ~NvmeFile();
  NvmeFile(NvmeFile&&) noexcept;
  NvmeFile& operator=(NvmeFile&&) noexcept;
  NvmeFile(const NvmeFile&) = delete;
  NvmeFile& operator=(const NvmeFile&) = delete;

  const std::filesystem::path& path() const;
  const NvmeOptions& options() const;
  IoMode mode() const;
  uint64_t capacity() const;
  NvmeStats stats() const;
  // True when fixed buffers are available at all (slots allocated in the ring).
  bool fixed_buffers_enabled() const;

  // Grows the file (fallocate) to at least `capacity` bytes rounded up to 4 KiB.
  void reserve(uint64_t capacity);

  // Registers [data, data + bytes) as a fixed buffer. Returns false (and logs why) when
  // no slot is free, fixed buffers are disabled, or the kernel refuses (ENOMEM past
  // RLIMIT_MEMLOCK); transfers through unregistered memory still work, only without the
  // fixed-buffer fast path. data and bytes must be 4 KiB aligned.
  bool register_buffer(void* data, size_t bytes);
  bool register_buffer(AlignedBuffer& buffer) {
    return register_buffer(buffer.data(), buffer.capacity());
  }
  // Frees the slot of the buffer registered at `data`; no-op when not registered. The
  // caller must not have requests in flight on it.
  void unregister_buffer(const void* data);
  bool is_registered(const void* data, size_t bytes) const;

  // Synchronous transfers, pipelined inside.
  void write(uint64_t offset, const void* src, size_t bytes);
  void read(uint64_t offset, void* dst, size_t bytes);

  // Asynchronous transfers: queued at once, submitted as the queue has room, and driven
  // by wait()/ready(). The memory must stay valid until the ticket is waited for.
  Ticket submit_write(uint64_t offset, const void* src, size_t bytes);
  Ticket submit_read(uint64_t offset, void* dst, size_t bytes);
  // Blocks until the ticket's requests completed; throws its first error. A ticket is
  // consumed by wait(); waiting for an unknown ticket throws std::logic_error.
  void wait(Ticket ticket);
  // Submits and reaps without blocking; true once wait(ticket) would not block.
  bool ready(Ticket ticket);
  // Waits for every outstanding ticket; throws the first error met (after draining).
  void wait_all();
  size_t outstanding() const;

  // fdatasync(): makes written data durable (needed for buffered mode and for the
  // allocation metadata of fresh extents in direct mode).
  void sync();

  // One step of a pipelined pass (stream()): `bytes` read from `read_offset` into a
  // staging buffer (without one, the buffer is handed over as the step before it left
  // it), passed to fn, then written to `write_offset` (without one, nothing is written).
  // Offsets and bytes must be 4 KiB aligned.
  struct StreamStep {
    std::optional<uint64_t> read_offset;
    std::optional<uint64_t> write_offset;
    size_t bytes = 0;
  };
  using StreamFn = std::function<void(size_t step, std::span<std::byte> bytes)>;

  // Runs `steps` in order through the caller's staging buffers (>= 3, each 4 KiB aligned
  // and at least as large as the largest step; register them for the fixed-buffer path):
  // step i uses buffers[i % B]. While fn(i) runs, the reads of steps i+1 .. i+B-2 and the
  // write of step i-1 are in flight, so I/O overlaps fn in both directions. Returns once
  // every write has completed (call sync() for durability). If fn or a transfer throws,
  // every request of the pass is drained (the buffers are free again) and the exception
  // propagates.
  void stream(std::span<const StreamStep> steps, std::span<std::byte* const> buffers,
              const StreamFn& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Hands out 4 KiB aligned extents inside one file, first fit, coalescing on free. Keeps
// no state on disk: after a restart the owner rebuilds it with mark_used() from the
// metadata store's partition records.
class ExtentAllocator {
 public:
  explicit ExtentAllocator(uint64_t capacity = 0, uint64_t alignment = NvmeFile::kAlignment);

  // An extent of at least `bytes` (rounded up to the alignment; bytes == 0 is rejected),
  // or nullopt when no free hole is large enough (grow() and retry).
  std::optional<Extent> allocate(uint64_t bytes);
  // Returns an extent (its size rounded up to the alignment). Throws std::invalid_argument
  // on an unaligned offset, a range past capacity() or one that overlaps free space
  // (double free).
  void free(const Extent& extent);
  // Marks a specific extent as used (rebuilding after a restart). Throws when it is not
  // entirely free.
  void mark_used(const Extent& extent);
  // Extends the managed range to new_capacity (rounded up); never shrinks.
  void grow(uint64_t new_capacity);

  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t used_bytes() const { return capacity_ - free_bytes_; }
  uint64_t largest_free() const;
  // Free holes, offset -> length, for tests and diagnostics.
  const std::map<uint64_t, uint64_t>& holes() const { return free_; }

 private:
  void insert_free(uint64_t offset, uint64_t bytes);

  uint64_t capacity_ = 0;
  uint64_t alignment_;
  uint64_t free_bytes_ = 0;
  std::map<uint64_t, uint64_t> free_;
};

}  // namespace dsactor::storage
