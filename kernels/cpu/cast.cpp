#include "kernels/cpu/cast.h"

#include "kernels/cpu/detail.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

namespace dsactor::kernels::cpu {

// The software conversions below are the definition; the F16C array paths are only used
// because they give the same bits (NaN: quiet bit set, upper payload bits kept), which
// tests/kernels/test_kernel_cast.cpp checks exhaustively for half -> float.

uint16_t float_to_bf16(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>((b + rounding) >> 16);
}

float bf16_to_float(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

uint16_t float_to_fp16(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (b >> 16) & 0x8000u;
  uint32_t ax = b & 0x7fffffffu;
  if (ax > 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);     // >= 65520 -> inf
  if (ax >= 0x38800000u) {  // normal half: |x| >= 2^-14
    const uint32_t odd = (ax >> 13) & 1u;
    // Rebias the exponent (127 -> 15) and add the round-to-nearest-even increment at once.
    ax += 0xc8000fffu + odd;
    return static_cast<uint16_t>(sign | (ax >> 13));
  }
  // Subnormal half or zero: adding 0.5f (ulp 2^-24, the half subnormal step) lets the FPU
  // round to nearest even; the low mantissa bits are then the half's bit pattern.
  const float shifted = std::bit_cast<float>(ax) + 0.5f;
  return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1f) {
    // Inf stays inf; NaN gets its quiet bit set, as F16C's vcvtph2ps does.
    const uint32_t quiet = m != 0 ? 0x00400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | quiet | (m << 13));
  }
  if (e == 0) {
    const float mag = static_cast<float>(m) * 0x1p-24f;  // exact: m < 2^10
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

namespace {

constexpr size_t kParallelMin = size_t{1} << 16;

bool has_f16c() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

__attribute__((target("avx2,f16c"))) void floats_to_fp16_f16c(uint16_t* out, const float* in,
                                                              size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = float_to_fp16(in[i]);
}

__attribute__((target("avx2,f16c"))) void fp16_to_floats_f16c(float* out, const uint16_t* in,
                                                              size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = fp16_to_float(in[i]);
}

__attribute__((target("avx2,f16c"))) bool round_through_fp16_f16c(float* x, size_t n) {
  __m256 bad = _mm256_setzero_ps();
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    const __m256 r = _mm256_cvtph_ps(h);
    _mm256_storeu_ps(x + i, r);
    // !(|r| < inf) is true for inf and NaN.
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(r, absmask), inf, _CMP_NLT_UQ));
  }
  bool nonfinite = _mm256_movemask_ps(bad) != 0;
  for (; i < n; ++i) {
    x[i] = fp16_to_float(float_to_fp16(x[i]));
    nonfinite |= !std::isfinite(x[i]);
  }
  return nonfinite;
}

void floats_to_half_serial(uint16_t* out, const float* in, size_t n, HalfKind kind, bool f16c) {
  if (kind == HalfKind::kBF16) {
    for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
  } else if (f16c) {
    floats_to_fp16_f16c(out, in, n);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = float_to_fp16(in[i]);
  }
}

void half_to_floats_serial(float* out, const uint16_t* in, size_t n, HalfKind kind, bool f16c) {
  if (kind == HalfKind::kBF16) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
  } else if (f16c) {
    fp16_to_floats_f16c(out, in, n);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = fp16_to_float(in[i]);
  }
}

bool round_through_half_serial(float* x, size_t n, HalfKind kind, bool f16c) {
  if (kind == HalfKind::kFP16 && f16c) return round_through_fp16_f16c(x, n);
  bool nonfinite = false;
  for (size_t i = 0; i < n; ++i) {
    const float r = kind == HalfKind::kBF16 ? bf16_to_float(float_to_bf16(x[i]))
                                            : fp16_to_float(float_to_fp16(x[i]));
    x[i] = r;
    nonfinite |= !std::isfinite(r);
  }
  return nonfinite;
}

}  // namespace

void floats_to_half(uint16_t* out, const float* in, size_t n, HalfKind kind) {
  const bool f16c = has_f16c();
  detail::for_chunks(n, kParallelMin, 64, [&](size_t lo, size_t hi) {
    floats_to_half_serial(out + lo, in + lo, hi - lo, kind, f16c);
  });
}

void floats_to_half_one_thread(uint16_t* out, const float* in, size_t n, HalfKind kind) {
  floats_to_half_serial(out, in, n, kind, has_f16c());
}

void half_to_floats(float* out, const uint16_t* in, size_t n, HalfKind kind) {
  const bool f16c = has_f16c();
  detail::for_chunks(n, kParallelMin, 64, [&](size_t lo, size_t hi) {
    half_to_floats_serial(out + lo, in + lo, hi - lo, kind, f16c);
  });
}

bool round_through_half(float* x, size_t n, HalfKind kind) {
  const bool f16c = has_f16c();
  bool nonfinite = false;
  if (n < kParallelMin) return round_through_half_serial(x, n, kind, f16c);
  adopt_threads();
#pragma omp parallel reduction(|| : nonfinite)
  {
    const size_t nt = static_cast<size_t>(omp_get_num_threads());
    const size_t id = static_cast<size_t>(omp_get_thread_num());
    const size_t per = ((n + nt - 1) / nt + 63) / 64 * 64;
    const size_t lo = std::min(n, id * per);
    const size_t hi = std::min(n, lo + per);
    if (lo < hi) nonfinite = round_through_half_serial(x + lo, hi - lo, kind, f16c);
  }
  return nonfinite;
}

}  // namespace dsactor::kernels::cpu
