#include "offload_service/nvme_tier.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

#include "storage/crc32c.h"

namespace dsactor::offload {

using storage::align_up;
using storage::Extent;

NvmeTier::NvmeTier(const std::filesystem::path& dir, const storage::NvmeOptions& options)
    : file_name_("partitions.dat"), chunk_elems_(options.block_size / sizeof(float)) {
  if (options.block_size == 0 || options.block_size % storage::AlignedBuffer::kAlignment != 0) {
    throw std::invalid_argument("nvme tier: aio block size " + std::to_string(options.block_size) +
                                " is not a positive multiple of 4096");
  }
  std::filesystem::create_directories(dir);
  meta_ = std::make_unique<storage::MetadataStore>(dir / "metadata");
  file_ = std::make_unique<storage::NvmeFile>(dir / file_name_, 0, options);
  alloc_ = storage::ExtentAllocator(file_->capacity());
  // Three chunk buffers: one being computed, one being read ahead, one being written
  // behind. Registered once so every transfer takes the fixed-buffer path.
  ring_ = storage::AlignedBuffer(3 * 3 * chunk_elems_ * sizeof(float));
  file_->register_buffer(ring_);
  spdlog::info("nvme tier: {} ({} I/O, {} KiB chunks per array, queue depth {})",
               (dir / file_name_).string(), storage::to_string(file_->mode()),
               options.block_size / 1024, options.queue_depth);
}

NvmeTier::~NvmeTier() = default;

uint64_t NvmeTier::extent_bytes(uint64_t n) const {
  const uint64_t full = n / chunk_elems_, rest = n % chunk_elems_;
  return full * 3 * chunk_elems_ * sizeof(float) + 3 * align_up(rest * sizeof(float));
}

void NvmeTier::adopt(const Extent& extent) {
  if (extent.end() > alloc_.capacity()) {
    throw std::runtime_error("nvme tier: extent [" + std::to_string(extent.offset) + ", " +
                             std::to_string(extent.end()) + ") lies past the end of " +
                             file_->path().string());
  }
  alloc_.mark_used(extent);
}

void NvmeTier::release(const Extent& extent) {
  alloc_.free(extent);
}

Extent NvmeTier::allocate(uint64_t bytes) {
  if (auto e = alloc_.allocate(bytes)) return *e;
  // Grow geometrically so a run of registrations does not fallocate once each.
  const uint64_t cap = std::max(alloc_.capacity() * 2, alloc_.capacity() + align_up(bytes));
  file_->reserve(cap);
  alloc_.grow(cap);
  auto e = alloc_.allocate(bytes);
  if (!e) throw std::runtime_error("nvme tier: no extent of " + std::to_string(bytes) + " bytes");
  return *e;
}

NvmeLocation NvmeTier::create(uint64_t n) {
  return stream(nullptr, n, {}, true);
}

NvmeLocation NvmeTier::write_new(uint64_t n, const ChunkFn& fn) {
  return stream(nullptr, n, fn, true);
}

NvmeLocation NvmeTier::rewrite(const NvmeLocation& from, uint64_t n, const ChunkFn& fn) {
  return stream(&from, n, fn, true);
}

void NvmeTier::read(const NvmeLocation& from, uint64_t n, const ChunkFn& fn) {
  stream(&from, n, fn, false);
}

NvmeLocation NvmeTier::stream(const NvmeLocation* from, uint64_t n, const ChunkFn& fn, bool write) {
  using Ticket = storage::NvmeFile::Ticket;
  const uint64_t C = chunk_elems_;
  const uint64_t chunks = (n + C - 1) / C;
  const uint64_t full = 3 * C * sizeof(float);
  auto count = [&](uint64_t k) { return std::min(C, n - k * C); };
  auto section = [&](uint64_t k) { return align_up(count(k) * sizeof(float)); };
  auto bytes = [&](uint64_t k) { return 3 * section(k); };
  std::array<std::byte*, 3> buf{ring_.data(), ring_.data() + full, ring_.data() + 2 * full};
  std::array<std::optional<Ticket>, 3> rd, wr;

  NvmeLocation out;
  if (write) out.extent = allocate(extent_bytes(n));
  uint32_t crc_in = 0, crc_out = 0;
  try {
    auto start_read = [&](uint64_t k) {
      const size_t b = k % 3;
      if (wr[b]) file_->wait(*std::exchange(wr[b], std::nullopt));  // write-behind done
      if (from) {
        rd[b] = file_->submit_read(from->extent.offset + k * full, buf[b], bytes(k));
      } else {
        std::memset(buf[b], 0, bytes(k));
      }
    };
    for (uint64_t k = 0; k < std::min<uint64_t>(2, chunks); ++k) start_read(k);
    for (uint64_t k = 0; k < chunks; ++k) {
      const size_t b = k % 3;
      if (rd[b]) file_->wait(*std::exchange(rd[b], std::nullopt));
      if (from) crc_in = storage::crc32c(buf[b], bytes(k), crc_in);
      if (fn) {
        auto* f = reinterpret_cast<float*>(buf[b]);
        const uint64_t s = section(k) / sizeof(float);
        fn(Chunk{k * C, count(k), f, f + s, f + 2 * s});
      }
      if (write) {
        crc_out = storage::crc32c(buf[b], bytes(k), crc_out);
        wr[b] = file_->submit_write(out.extent.offset + k * full, buf[b], bytes(k));
      }
      if (k + 2 < chunks) start_read(k + 2);
    }
    for (auto& t : wr) {
      if (t) file_->wait(*std::exchange(t, std::nullopt));
    }
    // Fresh extents of a preallocated file change its allocation metadata: make the data
    // durable before the metadata store points at it.
    if (write) file_->sync();
  } catch (...) {
    try {
      file_->wait_all();
    } catch (const std::exception& e) {
      spdlog::warn("nvme tier: draining after a failed pass: {}", e.what());
    }
    if (write) release(out.extent);
    throw;
  }
  if (from && crc_in != from->crc32c) {
    if (write) release(out.extent);
    char text[160];
    std::snprintf(text, sizeof text,
                  "extent at offset %llu (%llu bytes) of %s has crc32c %08x, recorded %08x",
                  static_cast<unsigned long long>(from->extent.offset),
                  static_cast<unsigned long long>(from->extent.bytes), file_name_.c_str(), crc_in,
                  from->crc32c);
    throw ChecksumError(text);
  }
  out.crc32c = crc_out;
  return out;
}

}  // namespace dsactor::offload
