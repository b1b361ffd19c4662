#include "kernels/cpu/adam.h"

// GCC 12's AVX-512 intrinsic headers initialise their "undefined" vectors as `__Y = __Y`,
// which -Wmaybe-uninitialized reports inside every caller (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <stdexcept>
#include <utility>

#include "kernels/cpu/detail.h"
#include "kernels/cpu/isa.h"

namespace dsactor::kernels::cpu {

// Bit-identity of the three paths: every multiply that feeds an add is written as an
// explicit fused multiply-add (fmaf / _mm*_fmadd_ps), in DeepSpeed's order
// (csrc/includes/cpu_adam.h, Step_AVX), and no other multiply feeds an add, so the
// compiler has nothing left to contract differently between them. sqrt and division are
// correctly rounded everywhere.

namespace {

// Per-step scalars, computed once in float the way DeepSpeed's Adam_Optimizer does.
struct AdamConsts {
  float gmul;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bc2_rsqrt;  // 1/sqrt(1 - beta2^step), or 1
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^step)
  float l2_wd;          // weight_decay when added to the gradient (Adam mode), else 0
  float neg_lr_wd;      // -lr*weight_decay when decoupled (AdamW mode), else 0
  bool l2;
  bool decoupled;
};

AdamConsts make_consts(const AdamHyper& h, int64_t step, float grad_multiplier) {
  AdamConsts k{};
  k.gmul = grad_multiplier;
  k.beta1 = h.beta1;
  k.beta2 = h.beta2;
  k.one_minus_beta1 = 1.0f - h.beta1;
  k.one_minus_beta2 = 1.0f - h.beta2;
  float bc1 = 1.0f;
  k.bc2_rsqrt = 1.0f;
  if (h.bias_correction) {
    const auto s = static_cast<double>(step);
    const auto beta1_t = static_cast<float>(std::pow(static_cast<double>(h.beta1), s));
    const auto beta2_t = static_cast<float>(std::pow(static_cast<double>(h.beta2), s));
    bc1 = 1.0f - beta1_t;
    k.bc2_rsqrt = 1.0f / std::sqrt(1.0f - beta2_t);
  }
  k.eps = h.eps;
  k.neg_step_size = -1.0f * h.lr / bc1;
  k.l2 = h.weight_decay > 0.0f && !h.adamw_mode;
  k.decoupled = h.weight_decay > 0.0f && h.adamw_mode;
  k.l2_wd = h.weight_decay;
  k.neg_lr_wd = -1.0f * h.lr * h.weight_decay;
  return k;
}

inline void adam_one(float& p, float& m, float& v, float grad, const AdamConsts& k) {
  float g = grad * k.gmul;
  if (k.l2) g = std::fma(p, k.l2_wd, g);
  m = std::fma(g, k.one_minus_beta1, m * k.beta1);
  v = std::fma(g * g, k.one_minus_beta2, v * k.beta2);
  const float denom = std::fma(std::sqrt(v), k.bc2_rsqrt, k.eps);
  const float upd = m / denom;
  if (k.decoupled) p = std::fma(p, k.neg_lr_wd, p);
  p = std::fma(upd, k.neg_step_size, p);
}

void adam_range_scalar(float* param, float* m, float* v, const float* grad, size_t lo, size_t hi,
                       const AdamConsts& k, HalfCopy half, float* fp32_copy) {
  for (size_t i = lo; i < hi; ++i) {
    adam_one(param[i], m[i], v[i], grad[i], k);  // grad[i] is read before fp32_copy[i] is written
    if (half.out != nullptr) {
      half.out[i] =
          half.kind == HalfKind::kBF16 ? float_to_bf16(param[i]) : float_to_fp16(param[i]);
    } else if (fp32_copy != nullptr) {
      fp32_copy[i] = param[i];
    }
  }
}

// The scalar tail's copies for a vector pass's kHalf (see adam_range_avx512).
template <int kHalf>
std::pair<HalfCopy, float*> tail_copy(void* copy) {
  if constexpr (kHalf == 1)
    return {HalfCopy{static_cast<uint16_t*>(copy), HalfKind::kBF16}, nullptr};
  if constexpr (kHalf == 2)
    return {HalfCopy{static_cast<uint16_t*>(copy), HalfKind::kFP16}, nullptr};
  if constexpr (kHalf == 3) return {HalfCopy{}, static_cast<float*>(copy)};
  return {HalfCopy{}, nullptr};
}

// ---- AVX-512 ----

__attribute__((target("avx512f"))) inline __m256i bf16_pack_avx512(__m512 p) {
  const __m512i b = _mm512_castps_si512(p);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// kHalf: the copy written beside the params: 0 none, 1 bf16, 2 fp16, 3 fp32 (`copy` points
// to uint16_t for 1 and 2, to float for 3; for 3 it may be `grad` itself: the vector of
// gradients is loaded before the vector of copies is stored).
template <bool kL2, bool kDecoupled, int kHalf>
__attribute__((target("avx512f"))) void adam_range_avx512(float* param, float* m, float* v,
                                                          const float* grad, size_t lo, size_t hi,
                                                          const AdamConsts& k, void* copy) {
  [[maybe_unused]] auto* half = static_cast<uint16_t*>(copy);
  const __m512 gmul = _mm512_set1_ps(k.gmul);
  const __m512 b1 = _mm512_set1_ps(k.beta1);
  const __m512 omb1 = _mm512_set1_ps(k.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(k.beta2);
  const __m512 omb2 = _mm512_set1_ps(k.one_minus_beta2);
  const __m512 bc2 = _mm512_set1_ps(k.bc2_rsqrt);
  const __m512 eps = _mm512_set1_ps(k.eps);
  const __m512 nss = _mm512_set1_ps(k.neg_step_size);
  const __m512 wd = _mm512_set1_ps(k.l2_wd);
  const __m512 nlrwd = _mm512_set1_ps(k.neg_lr_wd);
  size_t i = lo;
  for (; i + 16 <= hi; i += 16) {
    __m512 p = _mm512_loadu_ps(param + i);
    __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), gmul);
    __m512 mm = _mm512_loadu_ps(m + i);
    __m512 vv = _mm512_loadu_ps(v + i);
    if constexpr (kL2) g = _mm512_fmadd_ps(p, wd, g);
    mm = _mm512_fmadd_ps(g, omb1, _mm512_mul_ps(mm, b1));
    vv = _mm512_fmadd_ps(_mm512_mul_ps(g, g), omb2, _mm512_mul_ps(vv, b2));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), bc2, eps);
    const __m512 upd = _mm512_div_ps(mm, denom);
    if constexpr (kDecoupled) p = _mm512_fmadd_ps(p, nlrwd, p);
    p = _mm512_fmadd_ps(upd, nss, p);
    _mm512_storeu_ps(param + i, p);
    _mm512_storeu_ps(m + i, mm);
    _mm512_storeu_ps(v + i, vv);
    if constexpr (kHalf == 1) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(half + i), bf16_pack_avx512(p));
    } else if constexpr (kHalf == 2) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(half + i),
                          _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else if constexpr (kHalf == 3) {
      _mm512_storeu_ps(static_cast<float*>(copy) + i, p);
    }
  }
  const auto [tail_half, tail_fp32] = tail_copy<kHalf>(copy);
  adam_range_scalar(param, m, v, grad, i, hi, k, tail_half, tail_fp32);
}

// ---- AVX2 + FMA ----

__attribute__((target("avx2,fma,f16c"))) inline __m128i bf16_pack_avx2(__m256 p) {
  const __m256i b = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
  const __m256 nan = _mm256_cmp_ps(p, p, _CMP_UNORD_Q);
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(nan));
  // Every lane is <= 0xffff, so unsigned saturation packs exactly.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// The AVX-512 pass above at half the width, line for line. It is written out twice because a
// target attribute belongs to a whole function: one template body cannot be compiled for
// both instruction sets, and a wrapper around intrinsics would not inline across targets.
template <bool kL2, bool kDecoupled, int kHalf>
__attribute__((target("avx2,fma,f16c"))) void adam_range_avx2(float* param, float* m, float* v,
                                                              const float* grad, size_t lo,
                                                              size_t hi, const AdamConsts& k,
                                                              void* copy) {
  [[maybe_unused]] auto* half = static_cast<uint16_t*>(copy);
  const __m256 gmul = _mm256_set1_ps(k.gmul);
  const __m256 b1 = _mm256_set1_ps(k.beta1);
  const __m256 omb1 = _mm256_set1_ps(k.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(k.beta2);
  const __m256 omb2 = _mm256_set1_ps(k.one_minus_beta2);
  const __m256 bc2 = _mm256_set1_ps(k.bc2_rsqrt);
  const __m256 eps = _mm256_set1_ps(k.eps);
  const __m256 nss = _mm256_set1_ps(k.neg_step_size);
  const __m256 wd = _mm256_set1_ps(k.l2_wd);
  const __m256 nlrwd = _mm256_set1_ps(k.neg_lr_wd);
  size_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    __m256 p = _mm256_loadu_ps(param + i);
    __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gmul);
    __m256 mm = _mm256_loadu_ps(m + i);
    __m256 vv = _mm256_loadu_ps(v + i);
    if constexpr (kL2) g = _mm256_fmadd_ps(p, wd, g);
    mm = _mm256_fmadd_ps(g, omb1, _mm256_mul_ps(mm, b1));
    vv = _mm256_fmadd_ps(_mm256_mul_ps(g, g), omb2, _mm256_mul_ps(vv, b2));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), bc2, eps);
    const __m256 upd = _mm256_div_ps(mm, denom);
    if constexpr (kDecoupled) p = _mm256_fmadd_ps(p, nlrwd, p);
    p = _mm256_fmadd_ps(upd, nss, p);
    _mm256_storeu_ps(param + i, p);
    _mm256_storeu_ps(m + i, mm);
    _mm256_storeu_ps(v + i, vv);
    if constexpr (kHalf == 1) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(half + i), bf16_pack_avx2(p));
    } else if constexpr (kHalf == 2) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(half + i),
                       _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else if constexpr (kHalf == 3) {
      _mm256_storeu_ps(static_cast<float*>(copy) + i, p);
    }
  }
  const auto [tail_half, tail_fp32] = tail_copy<kHalf>(copy);
  adam_range_scalar(param, m, v, grad, i, hi, k, tail_half, tail_fp32);
}

using RangeFn = void (*)(float*, float*, float*, const float*, size_t, size_t, const AdamConsts&,
                         void*);

using detail::detect_isa;
using detail::Isa;

template <bool kL2, bool kDecoupled, int kHalf>
RangeFn pick_for(Isa isa) {
  if (isa == Isa::kAvx512) return &adam_range_avx512<kL2, kDecoupled, kHalf>;
  return &adam_range_avx2<kL2, kDecoupled, kHalf>;
}

template <bool kL2, bool kDecoupled>
RangeFn pick_half(Isa isa, const HalfCopy& half, const float* fp32_copy) {
  if (half.out == nullptr)
    return fp32_copy ? pick_for<kL2, kDecoupled, 3>(isa) : pick_for<kL2, kDecoupled, 0>(isa);
  if (half.kind == HalfKind::kBF16) return pick_for<kL2, kDecoupled, 1>(isa);
  return pick_for<kL2, kDecoupled, 2>(isa);
}

RangeFn pick(Isa isa, const AdamConsts& k, const HalfCopy& half, const float* fp32_copy) {
  if (k.l2) return pick_half<true, false>(isa, half, fp32_copy);
  if (k.decoupled) return pick_half<false, true>(isa, half, fp32_copy);
  return pick_half<false, false>(isa, half, fp32_copy);
}

void refuse_two_copies(const HalfCopy& half, const float* fp32_copy) {
  if (half.out != nullptr && fp32_copy != nullptr)
    throw std::invalid_argument("adam_step: a half copy and an fp32 copy at once");
}

// Below this many elements a second thread costs more than it saves.
constexpr size_t kParallelMin = size_t{1} << 15;

}  // namespace

void adam_step_reference(float* param, float* m, float* v, const float* grad, size_t n,
                         const AdamHyper& h, int64_t step, float grad_multiplier, HalfCopy half,
                         float* fp32_copy) {
  refuse_two_copies(half, fp32_copy);
  const AdamConsts k = make_consts(h, step, grad_multiplier);
  adam_range_scalar(param, m, v, grad, 0, n, k, half, fp32_copy);
}

namespace {

void adam_step_on(Isa isa, float* param, float* m, float* v, const float* grad, size_t n,
                  const AdamHyper& h, int64_t step, float grad_multiplier, HalfCopy half,
                  float* fp32_copy) {
  refuse_two_copies(half, fp32_copy);
  const AdamConsts k = make_consts(h, step, grad_multiplier);
  if (isa == Isa::kScalar) {
    detail::for_chunks(n, kParallelMin, 64, [&](size_t lo, size_t hi) {
      adam_range_scalar(param, m, v, grad, lo, hi, k, half, fp32_copy);
    });
    return;
  }
  const RangeFn fn = pick(isa, k, half, fp32_copy);
  void* copy = half.out != nullptr ? static_cast<void*>(half.out) : static_cast<void*>(fp32_copy);
  detail::for_chunks(n, kParallelMin, 64,
                     [&](size_t lo, size_t hi) { fn(param, m, v, grad, lo, hi, k, copy); });
}

}  // namespace

void adam_step(float* param, float* m, float* v, const float* grad, size_t n, const AdamHyper& h,
               int64_t step, float grad_multiplier, HalfCopy half, float* fp32_copy) {
  adam_step_on(detect_isa(), param, m, v, grad, n, h, step, grad_multiplier, half, fp32_copy);
}

void adam_step_isa(const char* isa, float* param, float* m, float* v, const float* grad, size_t n,
                   const AdamHyper& h, int64_t step, float grad_multiplier, HalfCopy half,
                   float* fp32_copy) {
  adam_step_on(detail::isa_named(isa, "adam_step_isa"), param, m, v, grad, n, h, step,
               grad_multiplier, half, fp32_copy);
}

GradStats adam_step_with_stats(float* param, float* m, float* v, const float* grad, size_t n,
                               const AdamHyper& h, int64_t step, float grad_multiplier,
                               float* fp32_copy) {
  const AdamConsts k = make_consts(h, step, grad_multiplier);
  const Isa isa = detect_isa();
  const RangeFn fn = isa == Isa::kScalar ? nullptr : pick(isa, k, HalfCopy{}, fp32_copy);
  constexpr size_t kBlock = detail::kGradStatsBlock;
  return detail::grad_stats_then(grad, n, [&](size_t lo, size_t len) {
    // The block is in cache: the -0 check and the update read it there (the update writes
    // a copy over it only after reading each element).
    const float* g = grad + lo;
    float* copy = fp32_copy ? fp32_copy + lo : nullptr;
    alignas(64) float plus_zero[kBlock];
    if (has_negative_zero(g, len)) {
      for (size_t i = 0; i < len; ++i) plus_zero[i] = 0.0f + g[i];
      g = plus_zero;
    }
    if (fn) {
      fn(param + lo, m + lo, v + lo, g, 0, len, k, copy);
    } else {
      adam_range_scalar(param + lo, m + lo, v + lo, g, 0, len, k, HalfCopy{}, copy);
    }
  });
}

const char* adam_isa() {
  return detail::isa_name(detect_isa());
}

}  // namespace dsactor::kernels::cpu

#pragma GCC diagnostic pop
