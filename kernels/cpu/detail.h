#pragma once
// Internal helpers of kernels/cpu (not part of the kernel interface).
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace dsactor::kernels::cpu::detail {

// Runs f(lo, hi) on one contiguous piece of [0,n) per OpenMP thread, pieces aligned to
// `align` elements, or on all of [0,n) inline when n < serial_below. Elementwise kernels
// use it so every element sees the same code path whatever the thread count.
template <typename F>
void for_chunks(size_t n, size_t serial_below, size_t align, F&& f) {
  if (n < serial_below) {
    f(size_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const size_t nt = static_cast<size_t>(omp_get_num_threads());
    const size_t id = static_cast<size_t>(omp_get_thread_num());
    const size_t per = ((n + nt - 1) / nt + align - 1) / align * align;
    const size_t lo = std::min(n, id * per);
    const size_t hi = std::min(n, lo + per);
    if (lo < hi) f(lo, hi);
  }
}

// exp(x) written so loops over it vectorize (glibc's expf/tanhf do not without
// -ffast-math). Cody-Waite reduction + Cephes' degree-6 polynomial: ~1-2 ulp over the
// range that matters here (softmax arguments <= 0, GELU's tanh). Inputs are clamped to
// [-87, 88.3], so exp of very negative x gives ~1e-38 instead of 0.
inline float exp_vec(float x) {
  x = std::min(std::max(x, -87.0f), 88.3f);
  const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to int
  float r = x - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const int32_t ki = static_cast<int32_t>(k);
  return y * std::bit_cast<float>(static_cast<uint32_t>(ki + 127) << 23);
}

// tanh with ~1e-7 absolute error (relative error is larger near 0, which GELU absorbs
// because tanh is added to 1 there).
inline float tanh_vec(float x) {
  const float e = exp_vec(2.0f * x);
  return 1.0f - 2.0f / (e + 1.0f);
}

}  // namespace dsactor::kernels::cpu::detail
