#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace dsactor::trainer {

// A zero-initialised, 64-byte aligned float array: the storage of one flat parameter block
// (or its gradient / Adam moments). Cache-line alignment keeps every SIMD kernel on aligned
// loads and lets a block be split into partitions at cache-line boundaries.
//
// Buffers of 1 MiB and more are their own anonymous mappings (zeroed by the kernel, pages
// touched only when written, transparent huge pages where the kernel allows them): freeing
// one returns its memory to the system at once. Through malloc, a ZeRO-3 trainer that
// allocates and frees blocks every step from several threads (the fetch thread, the compute
// thread) would keep each thread's arena at its own high-water mark, and its resident
// memory would be the sum of those, well above what it holds at any moment.
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
  FloatBuffer(FloatBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  FloatBuffer& operator=(FloatBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  ~FloatBuffer() { release(); }

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
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      madvise(p, bytes, MADV_HUGEPAGE);  // best effort: fewer page faults per block
      data_ = static_cast<float*>(p);    // page-aligned, and already zero
      return;
    }
    data_ = static_cast<float*>(std::aligned_alloc(kAlignment, bytes));
    if (data_ == nullptr) throw std::bad_alloc();
    if (zeroed) std::memset(data_, 0, bytes);
  }
  static size_t allocated_bytes(size_t n) {
    return (n * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
  }
  void release() {
    if (data_ == nullptr) return;
    const size_t bytes = allocated_bytes(n_);
    if (bytes >= kMapFrom)
      munmap(data_, bytes);
    else
      std::free(data_);
    data_ = nullptr;
  }

  float* data_ = nullptr;
  size_t n_ = 0;
};

}  // namespace dsactor::trainer
