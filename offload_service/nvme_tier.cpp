#include "offload_service/nvme_tier.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <sys/stat.h>
#include <sys/statvfs.h>

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
  ring_ = memory.allocate(staging_bytes());
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

uint64_t NvmeTier::file_bytes() const {
  struct stat st {};
  if (::stat(file_->path().c_str(), &st) != 0) return file_->capacity();
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

uint64_t NvmeTier::room_bytes() const {
  struct statvfs fs {};
  if (::statvfs(file_->path().parent_path().c_str(), &fs) != 0) return alloc_.free_bytes();
  return alloc_.free_bytes() + static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
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
  // Grow by what the free tail lacks, plus a sixteenth of the file so a run of
  // registrations does not fallocate once each: the file stays within ~6% of its high-water
  // mark, where doubling could leave half of it unused (the disk footprint).
  const uint64_t cap0 = alloc_.capacity();
  uint64_t tail = 0;
  if (const auto& holes = alloc_.holes(); !holes.empty()) {
    const auto& [offset, length] = *holes.rbegin();
    if (offset + length == cap0) tail = length;
  }
  const uint64_t cap = cap0 + std::max(align_up(bytes) - tail, align_up(cap0 / 16));
  file_->reserve(cap);
  alloc_.grow(cap);
  auto e = alloc_.allocate(bytes);
  if (!e) throw std::runtime_error("nvme tier: no extent of " + std::to_string(bytes) + " bytes");
  return *e;
}

NvmeLocation NvmeTier::create(uint64_t n) {
  return stream_into_fresh(nullptr, n, {});
}

NvmeLocation NvmeTier::write_new(uint64_t n, const ChunkFn& fn) {
  return stream_into_fresh(nullptr, n, fn);
}

NvmeLocation NvmeTier::rewrite(const NvmeLocation& from, uint64_t n, const ChunkFn& fn) {
  return stream_into_fresh(&from, n, fn);
}

void NvmeTier::read(const NvmeLocation& from, uint64_t n, const ChunkFn& fn) {
  stream(Pass{&from, std::nullopt, false, nullptr}, n, fn);
}

void NvmeTier::read_master(const NvmeLocation& from, uint64_t n, const ChunkFn& fn) {
  if (!from.master_crc32c) return read(from, n, fn);
  const NvmeLocation master{from.extent, *from.master_crc32c, std::nullopt};
  stream(Pass{&master, std::nullopt, true, nullptr}, n, fn);
}

Extent NvmeTier::reserve(uint64_t n) {
  return allocate(extent_bytes(n));
}

uint32_t NvmeTier::accumulate(const Extent& next, uint64_t n, std::optional<uint32_t> sum,
                              const GradFn& fn) {
  const NvmeLocation held{next, sum.value_or(0), std::nullopt};
  return stream(Pass{sum ? &held : nullptr, next, true, nullptr}, n,
                [&](const Chunk& c) { fn(c.first, c.count, c.master); })
      .crc32c;
}

NvmeLocation NvmeTier::rewrite_with(const NvmeLocation& from, const NvmeLocation& gradient,
                                    uint64_t n, const ChunkFn& fn) {
  NvmeLocation out;
  out = stream(Pass{&from, gradient.extent, false, &gradient}, n, fn);
  out.extent = gradient.extent;
  // The new state must be durable before the metadata store points at it.
  file_->sync();
  return out;
}

NvmeLocation NvmeTier::stream_into_fresh(const NvmeLocation* from, uint64_t n, const ChunkFn& fn) {
  NvmeLocation out;
  out.extent = allocate(extent_bytes(n));
  try {
    const Extent extent = out.extent;
    out = stream(Pass{from, extent, false, nullptr}, n, fn);
    out.extent = extent;
    // Fresh extents of a preallocated file change its allocation metadata: make the data
    // durable before the metadata store points at it.
    file_->sync();
  } catch (...) {
    release(out.extent);
    throw;
  }
  return out;
}

void NvmeTier::checksum_failed(const NvmeLocation& at, uint32_t got) const {
  char text[160];
  std::snprintf(
      text, sizeof text, "extent at offset %llu (%llu bytes) of %s has crc32c %08x, recorded %08x",
      static_cast<unsigned long long>(at.extent.offset),
      static_cast<unsigned long long>(at.extent.bytes), file_name_.c_str(), got, at.crc32c);
  throw ChecksumError(text);
}

void NvmeTier::count_transfers(const Pass& pass, uint64_t chunk_bytes, uint64_t section_bytes) {
  const uint64_t read = (pass.from ? chunk_bytes : 0) + (pass.gradient ? section_bytes : 0);
  read_bytes_.fetch_add(read, std::memory_order_relaxed);
  if (pass.into) written_bytes_.fetch_add(chunk_bytes, std::memory_order_relaxed);
}

NvmeLocation NvmeTier::stream(const Pass& pass, uint64_t n, const ChunkFn& fn) {
  const uint64_t C = chunk_elems_;
  const uint64_t chunks = (n + C - 1) / C;
  const uint64_t full = 3 * C * sizeof(float);  // a chunk's stride in the extent and the ring
  // Chunk k is one transfer: its three sections (or its master section), each padded to 4 KiB.
  std::vector<uint64_t> section(chunks);
  std::vector<storage::NvmeFile::StreamStep> steps(chunks);
  for (uint64_t k = 0; k < chunks; ++k) {
    section[k] = align_up(std::min(C, n - k * C) * sizeof(float));
    if (pass.from) steps[k].read_offset = pass.from->extent.offset + k * full;
    if (pass.into) steps[k].write_offset = pass.into->offset + k * full;
    steps[k].bytes = pass.master_only ? section[k] : 3 * section[k];
  }
  std::vector<std::byte*> buffers(buffer_count_);
  for (unsigned b = 0; b < buffer_count_; ++b) buffers[b] = ring_->data() + b * full;
  // The gradient of chunk k + 1 is read while chunk k is computed.
  std::byte* aux[2] = {ring_->data() + buffer_count_ * full,
                       ring_->data() + buffer_count_ * full + C * sizeof(float)};
  std::optional<storage::NvmeFile::Ticket> aux_read[2];
  auto read_gradient = [&](uint64_t k) {
    if (pass.gradient && k < chunks) {
      aux_read[k % 2] =
          file_->submit_read(pass.gradient->extent.offset + k * full, aux[k % 2], section[k]);
    }
  };
  uint32_t crc_in = 0, crc_out = 0, crc_gradient = 0, crc_master = 0;
  try {
    read_gradient(0);
    file_->stream(steps, buffers, [&](size_t k, std::span<std::byte> bytes) {
      count_transfers(pass, steps[k].bytes, section[k]);
      if (pass.from) {
        crc_in = checksum::crc32c(bytes.data(), bytes.size(), crc_in);
      } else {
        std::memset(bytes.data(), 0, bytes.size());
      }
      const float* grad = nullptr;
      if (pass.gradient) {
        file_->wait(*std::exchange(aux_read[k % 2], std::nullopt));
        crc_gradient = checksum::crc32c(aux[k % 2], section[k], crc_gradient);
        grad = reinterpret_cast<const float*>(aux[k % 2]);
        read_gradient(k + 1);
      }
      if (fn) {
        auto* f = reinterpret_cast<float*>(bytes.data());
        const uint64_t s = section[k] / sizeof(float);
        const bool all = !pass.master_only;
        fn(Chunk{k * C, std::min(C, n - k * C), f, all ? f + s : nullptr, all ? f + 2 * s : nullptr,
                 grad});
      }
      if (pass.into) {
        crc_out = checksum::crc32c(bytes.data(), bytes.size(), crc_out);
        crc_master = checksum::crc32c(bytes.data(), section[k], crc_master);
      }
    });
  } catch (...) {
    for (auto& t : aux_read) {
      try {
        if (t) file_->wait(*std::exchange(t, std::nullopt));
      } catch (const std::exception& e) {
        spdlog::error("nvme tier: while unwinding a pass: {}", e.what());
      }
    }
    throw;
  }
  if (pass.from && crc_in != pass.from->crc32c) checksum_failed(*pass.from, crc_in);
  if (pass.gradient && crc_gradient != pass.gradient->crc32c) {
    checksum_failed(*pass.gradient, crc_gradient);
  }
  NvmeLocation out;
  out.crc32c = crc_out;
  if (!pass.master_only) out.master_crc32c = crc_master;
  return out;
}

}  // namespace dsactor::offload
