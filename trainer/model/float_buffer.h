#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace dsactor::trainer {

// A zero-initialised, 64-byte aligned float array: the storage of one flat parameter block
// (or its gradient / Adam moments). Cache-line alignment keeps every SIMD kernel on aligned
// loads and lets a block be split into partitions at cache-line boundaries.
class FloatBuffer {
 public:
  static constexpr size_t kAlignment = 64;
  FloatBuffer() = default;
  explicit FloatBuffer(size_t n) : n_(n) {
    if (n == 0) return;
    const size_t bytes = (n * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
    data_ = static_cast<float*>(std::aligned_alloc(kAlignment, bytes));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, 0, bytes);
  }
  FloatBuffer(FloatBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  FloatBuffer& operator=(FloatBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  ~FloatBuffer() { std::free(data_); }

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
  float* data_ = nullptr;
  size_t n_ = 0;
};

}  // namespace dsactor::trainer
