#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

namespace dsactor::trainer {

// A zero-initialised, 64-byte aligned float array: the storage of one flat parameter block
// (or its gradient / Adam moments). Cache-line alignment keeps every SIMD kernel on aligned
// loads and lets a block be split into partitions at cache-line boundaries.
//
// Buffers of 1 MiB and more are their own anonymous mappings (pages touched only when
// written, transparent huge pages where the kernel allows them). Through malloc, a ZeRO-3
// trainer that allocates and frees blocks every step from several threads (the fetch
// thread, the compute thread) would keep each thread's arena at its own high-water mark,
// and its resident memory would be the sum of those, well above what it holds at any
// moment.
//
// A freed mapping goes to a process-wide cache of idle mappings, up to a byte limit
// (set_cache_limit, 0 by default: freed memory goes back to the system at once), and the
// next buffer of exactly that size takes it: a ZeRO-3 step frees and allocates every
// block's parameters twice and its gradient once, and fresh pages cost a page fault and
// the kernel's zeroing each, which on gpt2 was a third of the trainer's CPU time.
class FloatBuffer {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kMapFrom = size_t{1} << 20;  // bytes
  FloatBuffer() = default;
  explicit FloatBuffer(size_t n) : FloatBuffer(n, true) {}
  // Without zeroing, for a buffer the caller fills completely: its pages are touched only
  // as they are written (a fetch that copies a large block in chunks while giving the
  // received copy back never holds the block twice).
  static FloatBuffer uninitialized(size_t n) { return FloatBuffer(n, false); }
  // n floats at `data` (64-byte aligned) that `owner` keeps alive: released with the
  // buffer instead of being freed (a shared-memory slot a service wrote a block into).
  static FloatBuffer adopt(float* data, size_t n, std::shared_ptr<void> owner) {
    FloatBuffer b;
    b.data_ = data;
    b.n_ = n;
    b.owner_ = std::move(owner);
    return b;
  }
  FloatBuffer(FloatBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        n_(std::exchange(o.n_, 0)),
        owner_(std::move(o.owner_)) {}
  FloatBuffer& operator=(FloatBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      n_ = std::exchange(o.n_, 0);
      owner_ = std::move(o.owner_);
    }
    return *this;
  }
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  ~FloatBuffer() { release(); }

  // The most bytes of idle mappings the process keeps for reuse, and the largest mapping
  // it keeps (thread-safe; lowering the limit unmaps what is over at once). Returns the
  // previous limit.
  static size_t set_cache_limit(size_t bytes, size_t largest_mapping);
  static size_t cached_bytes();  // idle mappings held now

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(float); }
  void zero() {
    if (n_) std::memset(data_, 0, n_ * sizeof(float));
  }
  void copy_from(const FloatBuffer& o) {
    if (n_) std::memcpy(data_, o.data_, n_ * sizeof(float));
  }
  float& operator[](size_t i) { return data_[i]; }
  const float& operator[](size_t i) const { return data_[i]; }

 private:
  FloatBuffer(size_t n, bool zeroed) : n_(n) {
    if (n == 0) return;
    const size_t bytes = allocated_bytes(n);
    if (bytes >= kMapFrom) {
      data_ = static_cast<float*>(map_pages(bytes, zeroed));
      return;
    }
    data_ = static_cast<float*>(std::aligned_alloc(kAlignment, bytes));
    if (data_ == nullptr) throw std::bad_alloc();
    if (zeroed) std::memset(data_, 0, bytes);
  }
  static size_t allocated_bytes(size_t n) {
    return (n * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
  }
  // A mapping of `bytes`, from the cache when one of that size is idle (zeroed on request;
  // a fresh one is zero already).
  static void* map_pages(size_t bytes, bool zeroed);
  // To the cache, or back to the system when the cache is full.
  static void unmap_pages(void* p, size_t bytes);
  void release() {
    if (owner_) {
      owner_.reset();
      data_ = nullptr;
      return;
    }
    if (data_ == nullptr) return;
    const size_t bytes = allocated_bytes(n_);
    if (bytes >= kMapFrom)
      unmap_pages(data_, bytes);
    else
      std::free(data_);
    data_ = nullptr;
  }

  float* data_ = nullptr;
  size_t n_ = 0;
  std::shared_ptr<void> owner_;  // adopted memory
};

}  // namespace dsactor::trainer
