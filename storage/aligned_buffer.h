#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace dsactor::storage {

// Options of AlignedBuffer. Defaults give a plain zero-filled, pageable buffer.
struct AlignedBufferOptions {
  // Try to mlock() the pages so the kernel never swaps them out and DMA (O_DIRECT,
  // cudaHostRegister) always finds them resident. Default: false. A failure (EPERM, or
  // ENOMEM past RLIMIT_MEMLOCK, common in sandboxes and containers) is reported through
  // AlignedBuffer::lock_status(), not thrown, unless require_lock is set.
  bool lock = false;

  // Throw std::runtime_error when lock is set and mlock() fails. Default: false.
  bool require_lock = false;
};

// Outcome of the optional mlock(): whether the pages are locked and, when not, why.
struct LockStatus {
  bool requested = false;
  bool locked = false;
  int error = 0;  // errno of the failed mlock(), 0 otherwise

  // "not requested", "locked" or "mlock failed: <errno text>".
  std::string describe() const;
};

// A host buffer whose start and capacity are multiples of kAlignment (4096), the
// granularity O_DIRECT and io_uring fixed buffers need. Memory comes from an anonymous
// mmap, so it is zero-filled and returned to the kernel on destruction; from kHugePageBytes
// up it asks for 2 MiB pages. Move-only.
class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 4096;
  // From this capacity up the buffer asks for 2 MiB pages (MADV_HUGEPAGE).
  static constexpr size_t kHugePageBytes = size_t{2} << 20;

  AlignedBuffer() = default;
  // Allocates at least `bytes` (capacity() rounds up to kAlignment). bytes == 0 gives an
  // empty buffer. Throws std::runtime_error with the errno text when mmap fails.
  explicit AlignedBuffer(size_t bytes, const AlignedBufferOptions& options = {});
  ~AlignedBuffer();

  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  // The size asked for at construction.
  size_t size() const { return size_; }
  // size() rounded up to kAlignment; all of it is usable.
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }

  std::span<std::byte> span() { return {data_, size_}; }
  std::span<const std::byte> span() const { return {data_, size_}; }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data_);
  }

  const LockStatus& lock_status() const { return lock_; }

 private:
  void release() noexcept;

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  LockStatus lock_;
};

// Rounds n up to a multiple of `alignment` (a power of two).
constexpr uint64_t align_up(uint64_t n, uint64_t alignment = AlignedBuffer::kAlignment) {
  return (n + alignment - 1) & ~(alignment - 1);
}
constexpr bool is_aligned(uint64_t n, uint64_t alignment = AlignedBuffer::kAlignment) {
  return (n & (alignment - 1)) == 0;
}
inline bool is_aligned(const void* p, uint64_t alignment = AlignedBuffer::kAlignment) {
  return is_aligned(reinterpret_cast<uintptr_t>(p), alignment);
}

}  // namespace dsactor::storage
