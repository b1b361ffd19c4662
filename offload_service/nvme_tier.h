#pragma once

// The NVMe tier of the partition store: one preallocated data file (DIR/partitions.dat)
// holding each partition's master, m and v, its extent allocator and the registered
// staging ring. Owned by the nvme_io actor (nvme_io_actor.h); the RocksDB metadata store
// (DIR/metadata, partition -> extent, version, crc32c) belongs to the metadata actor and
// is only borrowed here, at construction, to check the recorded extent layout.
//
// Layout of one partition's extent: chunks of C = chunk_elements elements, each chunk
// [master | m | v] with every section padded to 4 KiB, so one chunk is one contiguous
// aligned transfer that carries everything the optimizer needs for those elements. The
// crc32c covers the whole extent, chunk after chunk.
//
// Every pass goes through storage::NvmeFile::stream over the staging ring (buffer_count - 2
// chunks read ahead, one written behind). A rewrite (CommitStep) streams from the current
// extent into a fresh one, and the caller switches the record only after that:
// a corrupt source is detected by its crc when the pass ends and the fresh extent is
// dropped, so corrupt bytes are never written back under a new crc, and a crash mid-pass
// leaves the previous version intact.
//
// A step's gradient lives on NVMe too, in the master sections of the extent that the
// step's commit will write (reserved at the step's first push): accumulated there chunk by
// chunk, and read back by the commit's pass just before that chunk's new state overwrites
// it. So the tier holds at most two extents per partition (the committed state and the
// next one) and no per-element RAM.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "offload_service/host_memory.h"
#include "storage/metadata_store.h"
#include "storage/nvme_file.h"

namespace dsactor::offload {

// A stored extent failed its crc32c.
class ChecksumError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct NvmeLocation {
  storage::Extent extent;
  uint32_t crc32c = 0;
  // The crc32c of the master sections alone, chunk after chunk, when this process wrote the
  // extent (not recorded in the metadata): a fetch then reads only the master sections.
  std::optional<uint32_t> master_crc32c;
};

// The streaming knobs (ds_config offload `buffer_count` / `buffer_size`).
struct StagingOptions {
  // Elements of each array (master, m, v) in one chunk; a multiple of 1024 so each
  // section is 4 KiB aligned. The extent layout depends on it, so it is recorded in the
  // metadata at creation and a reopen with another value is refused.
  uint64_t chunk_elements = (uint64_t{1} << 20) / sizeof(float);
  // Staging buffers of 3 x chunk_elements floats in the rotation: one being computed,
  // buffer_count - 2 read ahead, one written behind. >= 3.
  unsigned buffer_count = 3;
};

// Every staging byte a tier with these options holds: the ring plus two sections of one
// array (the gradient a commit reads ahead).
inline uint64_t staging_bytes(const StagingOptions& s) {
  return (3 * uint64_t{s.buffer_count} + 2) * s.chunk_elements * sizeof(float);
}

class NvmeTier {
 public:
  // One chunk of a partition in a streaming pass: elements [first, first + count).
  struct Chunk {
    uint64_t first = 0;
    uint64_t count = 0;
    float* master = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    const float* grad = nullptr;  // rewrite with a gradient: the step's accumulated gradient
  };
  using ChunkFn = std::function<void(const Chunk&)>;
  // A piece of a gradient being accumulated: elements [first, first + count) in place.
  using GradFn = std::function<void(uint64_t first, uint64_t count, float* grad)>;

  // Throws std::invalid_argument when the options do not fit each other or the layout
  // recorded in DIR (naming both), std::runtime_error when DIR cannot be used.
  NvmeTier(const std::filesystem::path& dir, storage::MetadataStore& meta,
           const storage::NvmeOptions& options, const StagingOptions& staging,
           HostAllocator& memory);
  ~NvmeTier();

  const std::string& file_name() const { return file_name_; }
  uint64_t chunk_elements() const { return chunk_elems_; }
  // Extent bytes of a partition of n elements.
  uint64_t extent_bytes(uint64_t n) const;
  uint64_t used_bytes() const { return alloc_.used_bytes(); }
  unsigned buffer_count() const { return buffer_count_; }
  // Bytes of one staging buffer (3 sections of chunk_elements floats).
  uint64_t buffer_bytes() const { return 3 * chunk_elems_ * sizeof(float); }
  // Every staging byte: the ring plus the two gradient sections a commit reads ahead.
  uint64_t staging_bytes() const { return offload::staging_bytes({chunk_elems_, buffer_count_}); }

  // Bytes partitions.dat takes on disk (allocated blocks), the disk footprint.
  uint64_t file_bytes() const;
  // Bytes the tier can still hand out: free in partitions.dat plus what it may grow by on
  // its filesystem (statvfs).
  uint64_t room_bytes() const;

  // Bytes this tier's passes read from and wrote to partitions.dat since it opened: every
  // io_uring transfer of a pass (a chunk's sections, a commit's gradient read-ahead),
  // counted as each chunk reaches its function, so a pass that fails part-way counts the
  // chunks it got to. Readable from any thread.
  uint64_t read_bytes() const { return read_bytes_.load(std::memory_order_relaxed); }
  uint64_t written_bytes() const { return written_bytes_.load(std::memory_order_relaxed); }

  // Marks an extent from a reloaded record as used.
  void adopt(const storage::Extent& extent);
  void release(const storage::Extent& extent);

  // A fresh extent for n elements, all zero (written), with its crc.
  NvmeLocation create(uint64_t n);
  // A fresh extent for n elements whose chunks fn fills (they arrive zeroed).
  NvmeLocation write_new(uint64_t n, const ChunkFn& fn);
  // Streams `from` (n elements) through fn into a fresh extent; returns it. Throws
  // ChecksumError (fresh extent released) when `from` does not match its crc. `from`
  // stays allocated: the caller releases it once the new record is durable.
  NvmeLocation rewrite(const NvmeLocation& from, uint64_t n, const ChunkFn& fn);
  // Reads and verifies `from`, calling fn per chunk (read-only).
  void read(const NvmeLocation& from, uint64_t n, const ChunkFn& fn);
  // read() of the master sections alone (chunks without m and v), verified against
  // from.master_crc32c; the whole extent where that is unknown (reloaded at startup).
  void read_master(const NvmeLocation& from, uint64_t n, const ChunkFn& fn);

  // A fresh extent for n elements, nothing written: where a step's gradient accumulates
  // and its commit writes the new state.
  storage::Extent reserve(uint64_t n);
  // Accumulates into the gradient held in `next`'s master sections: `sum` (the crc of
  // what the last accumulation wrote) says there is one, read and verified (ChecksumError
  // when it does not match), else fn gets zeroes. Returns the crc of what it wrote.
  uint32_t accumulate(const storage::Extent& next, uint64_t n, std::optional<uint32_t> sum,
                      const GradFn& fn);
  // rewrite() into `gradient.extent` (from reserve()), each chunk's fn given the gradient
  // that accumulate() left there (verified against gradient.crc32c: ChecksumError). The
  // extent is the caller's to release on any failure.
  NvmeLocation rewrite_with(const NvmeLocation& from, const NvmeLocation& gradient, uint64_t n,
                            const ChunkFn& fn);

 private:
  // One pass over n elements: read `from` (crc-checked) or start from zeroes, call fn per
  // chunk, write into `into` when set. master_only: the master sections alone (a
  // gradient). gradient: the master sections of the `into` extent read into the aux
  // buffers before each chunk's fn (crc-checked against gradient->crc32c).
  struct Pass {
    const NvmeLocation* from = nullptr;
    std::optional<storage::Extent> into;
    bool master_only = false;
    const NvmeLocation* gradient = nullptr;
  };
  storage::Extent allocate(uint64_t bytes);
  // The crc32c of what was written (with that of its master sections), extent unset.
  NvmeLocation stream(const Pass& pass, uint64_t n, const ChunkFn& fn);
  // One chunk of a pass: `chunk_bytes` read (from an extent) and written (into one), and
  // `section_bytes` of gradient read ahead.
  void count_transfers(const Pass& pass, uint64_t chunk_bytes, uint64_t section_bytes);
  NvmeLocation stream_into_fresh(const NvmeLocation* from, uint64_t n, const ChunkFn& fn);
  [[noreturn]] void checksum_failed(const NvmeLocation& at, uint32_t got) const;

  std::string file_name_;
  std::unique_ptr<storage::NvmeFile> file_;
  storage::ExtentAllocator alloc_;
  uint64_t chunk_elems_;
  unsigned buffer_count_;
  // buffer_count chunk buffers, then two of one section (the gradient a commit reads),
  // registered with the io_uring ring.
  HostBufferPtr ring_;
  std::atomic<uint64_t> read_bytes_{0}, written_bytes_{0};
};

}  // namespace dsactor::offload
