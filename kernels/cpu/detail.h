#pragma once
// Internal helpers of kernels/cpu (not part of the kernel interface).
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/threads.h"

namespace dsactor::kernels::cpu::detail {

// grad_stats(grad, n), running after(lo, len) on each of its blocks right after the block's
// sum is taken, on the thread that took it (the block still in that core's cache).
using AfterStatsBlock = std::function<void(size_t lo, size_t len)>;
GradStats grad_stats_then(const float* grad, size_t n, const AfterStatsBlock& after);
// grad_stats' block: the elements one `after` call covers at most.
inline constexpr size_t kGradStatsBlock = 4096;

// Runs f(lo, hi) on one contiguous piece of [0,n) per OpenMP thread, pieces aligned to
// `align` elements, or on all of [0,n) inline when n < serial_below. Elementwise kernels
// use it so every element sees the same code path whatever the thread count.
template <typename F>
void for_chunks(size_t n, size_t serial_below, size_t align, F&& f) {
  if (n < serial_below) {
    f(size_t{0}, n);
    return;
  }
  adopt_threads();
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

// exp(x) written so that loops calling it vectorize (glibc's expf does not without
// -ffast-math): Cody-Waite reduction + Cephes' degree-6 polynomial, <= ~1.5 ulp on
// [-87, 88.5]; below -87 it returns 0, above 88.5 FLT_MAX (saturating rather than inf,
// so that callers forming e/(1+e) get 1, not inf/inf), NaN stays NaN. The range limits are
// applied with integer clamps and bit masks rather than float selects: under the default
// -ftrapping-math GCC will not if-convert a float select, and would sink the polynomial
// into a branch, which stops vectorization.
inline float exp_vec(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float tm = x * 1.44269504088896341f + kMagic;
  // round(x*log2(e)) read from the mantissa bits; wraps harmlessly out of range, then clamped.
  int32_t ki = static_cast<int32_t>(std::bit_cast<uint32_t>(tm) - std::bit_cast<uint32_t>(kMagic));
  ki = ki < -126 ? -126 : ki;
  ki = ki > 127 ? 127 : ki;
  const float k = static_cast<float>(ki);
  float r = x - k * 0.693359375f;  // ln2 split in two so k*ln2_hi is exact
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(ki + 127) << 23);
  const float y = (p * (r * r) + r + 1.0f) * scale;
  const uint32_t under = 0u - static_cast<uint32_t>(x < -87.0f);
  const uint32_t over = 0u - static_cast<uint32_t>(x > 88.5f);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(y) & ~(under | over)) |
                              (over & 0x7f7fffffu));
}

}  // namespace dsactor::kernels::cpu::detail
