#include "offload_service/nvme_tier.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "checksum/crc32c.h"

namespace dsactor::offload {

using storage::align_up;
using storage::Extent;

namespace {
const char* kLayoutTag = "offload-layout";
}

NvmeTier::NvmeTier(const std::filesystem::path& dir, storage::MetadataStore& meta,
                   const storage::NvmeOptions& options, const StagingOptions& staging,
                   HostAllocator& memory)
    : file_name_("partitions.dat"),
      chunk_elems_(staging.chunk_elements),
      buffer_count_(staging.buffer_count) {
  if (options.block_size == 0 || options.block_size % storage::AlignedBuffer::kAlignment != 0) {
    throw std::invalid_argument("nvme tier: aio block size " + std::to_string(options.block_size) +
                                " is not a positive multiple of 4096");
  }
  if (chunk_elems_ == 0 || chunk_elems_ % 1024 != 0 || buffer_count_ < 3) {
    throw std::invalid_argument("nvme tier: chunk of " + std::to_string(chunk_elems_) +
                                " elements (needs a positive multiple of 1024) and " +
                                std::to_string(buffer_count_) + " buffers (needs >= 3)");
  }
  // The extent layout is chunk_elements-wide; a directory written with another width
  // would be misread, so the width is recorded once and checked on every open.
  if (auto rec = meta.get_manifest(kLayoutTag)) {
    const uint64_t was = std::stoull(*rec);
    if (was != chunk_elems_) {
      throw std::invalid_argument(
          "nvme tier: " + dir.string() + " was created with chunks of " + std::to_string(was) +
          " elements (buffer_size " + std::to_string(3 * was * sizeof(float)) +
          " bytes); this service asks for " + std::to_string(chunk_elems_) +
          " elements (buffer_size " + std::to_string(3 * chunk_elems_ * sizeof(float)) +
          "); start it with the original --buffer-size / --aio-block-size");
    }
  } else {
    meta.put_manifest(kLayoutTag, std::to_string(chunk_elems_));
  }
  file_ = std::make_unique<storage::NvmeFile>(dir / file_name_, 0, options);
  alloc_ = storage::ExtentAllocator(file_->capacity());
  // The staging ring: one buffer being computed, buffer_count - 2 read ahead, one being
  // written behind. Registered once so every transfer takes the fixed-buffer path.
  ring_ = memory.allocate(buffer_count_ * buffer_bytes());
  file_->register_buffer(ring_->data(), ring_->capacity());
  spdlog::info(
      "nvme tier: {} ({} I/O, {} staging buffers of {} KiB = {} KiB chunks per array, queue "
      "depth {}, {} KiB requests)",
      (dir / file_name_).string(), storage::to_string(file_->mode()), buffer_count_,
      buffer_bytes() / 1024, chunk_elems_ * sizeof(float) / 1024, options.queue_depth,
      options.block_size / 1024);
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
  const uint64_t C = chunk_elems_;
  const uint64_t chunks = (n + C - 1) / C;
  const uint64_t full = 3 * C * sizeof(float);  // a chunk's stride in the extent and the ring
  NvmeLocation out;
  if (write) out.extent = allocate(extent_bytes(n));
  // Chunk k is one transfer: its three sections, each padded to 4 KiB.
  std::vector<uint64_t> section(chunks);
  std::vector<storage::NvmeFile::StreamStep> steps(chunks);
  for (uint64_t k = 0; k < chunks; ++k) {
    section[k] = align_up(std::min(C, n - k * C) * sizeof(float));
    if (from) steps[k].read_offset = from->extent.offset + k * full;
    if (write) steps[k].write_offset = out.extent.offset + k * full;
    steps[k].bytes = 3 * section[k];
  }
  std::vector<std::byte*> buffers(buffer_count_);
  for (unsigned b = 0; b < buffer_count_; ++b) buffers[b] = ring_->data() + b * full;
  uint32_t crc_in = 0, crc_out = 0;
  try {
    file_->stream(steps, buffers, [&](size_t k, std::span<std::byte> bytes) {
      if (from) {
        crc_in = checksum::crc32c(bytes.data(), bytes.size(), crc_in);
      } else {
        std::memset(bytes.data(), 0, bytes.size());
      }
      if (fn) {
        auto* f = reinterpret_cast<float*>(bytes.data());
        const uint64_t s = section[k] / sizeof(float);
        fn(Chunk{k * C, std::min(C, n - k * C), f, f + s, f + 2 * s});
      }
      if (write) crc_out = checksum::crc32c(bytes.data(), bytes.size(), crc_out);
    });
    // Fresh extents of a preallocated file change its allocation metadata: make the data
    // durable before the metadata store points at it.
    if (write) file_->sync();
  } catch (...) {
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
