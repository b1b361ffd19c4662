#include "kernels/cpu/lamb.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/detail.h"

namespace dsactor::kernels::cpu {
namespace {

// Per-step scalars, formed in float as the CUDA kernel's host code forms them.
struct LambConsts {
  float gmul;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float weight_decay;
  bool eps_inside_sqrt;
  float step_size;
};

LambConsts make_consts(const LambHyper& h, int64_t step, float grad_multiplier) {
  LambConsts k{};
  k.gmul = grad_multiplier;
  k.beta1 = h.beta1;
  k.beta2 = h.beta2;
  k.one_minus_beta1 = 1.0f - h.beta1;
  k.one_minus_beta2 = 1.0f - h.beta2;
  k.eps = h.eps;
  k.weight_decay = h.weight_decay;
  k.eps_inside_sqrt = h.eps_inside_sqrt;
  k.step_size = h.lr;
  if (h.bias_correction) {
    const auto s = static_cast<double>(step);
    const auto bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), s));
    const auto bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta2), s));
    k.step_size = h.lr * std::sqrt(bc2) / bc1;
  }
  return k;
}

// The update of one element from its (already advanced) moments.
inline float lamb_update(float p, float m, float v, const LambConsts& k) {
  const float denom = k.eps_inside_sqrt ? std::sqrt(v + k.eps) : std::sqrt(v) + k.eps;
  return std::fma(k.weight_decay, p, m / denom);
}

// Advances m and v of [lo, hi) and returns the sums of param^2 and update^2 there.
inline void advance_moments(const float* param, float* m, float* v, const float* grad, size_t lo,
                            size_t hi, const LambConsts& k, double& w2, double& u2) {
  for (size_t i = lo; i < hi; ++i) {
    const float g = grad[i] * k.gmul;
    m[i] = std::fma(g, k.one_minus_beta1, m[i] * k.beta1);
    v[i] = std::fma(g * g, k.one_minus_beta2, v[i] * k.beta2);
    const double u = lamb_update(param[i], m[i], v[i], k);
    w2 += static_cast<double>(param[i]) * static_cast<double>(param[i]);
    u2 += u * u;
  }
}

float trust_ratio(double w2, double u2, const LambHyper& h) {
  const auto w = static_cast<float>(std::sqrt(w2));
  const auto u = static_cast<float>(std::sqrt(u2));
  if (w == 0.0f || u == 0.0f) return 1.0f;
  return std::clamp(w / u, h.min_coeff, h.max_coeff);
}

inline void apply_update(float* param, const float* m, const float* v, size_t lo, size_t hi,
                         const LambConsts& k, float coeff) {
  const float scale = -k.step_size * coeff;
  for (size_t i = lo; i < hi; ++i)
    param[i] = std::fma(scale, lamb_update(param[i], m[i], v[i], k), param[i]);
}

constexpr size_t kChunk = 4096;
// Below this many elements a second thread costs more than it saves.
constexpr size_t kParallelMin = size_t{1} << 15;

}  // namespace

float lamb_step(float* param, float* m, float* v, const float* grad, size_t n, const LambHyper& h,
                int64_t step, float grad_multiplier) {
  const LambConsts k = make_consts(h, step, grad_multiplier);
  const size_t nchunks = (n + kChunk - 1) / kChunk;
  std::vector<double> w2(nchunks, 0.0), u2(nchunks, 0.0);
  const auto nc = static_cast<int64_t>(nchunks);
  adopt_threads();
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < nc; ++c) {
    const size_t lo = static_cast<size_t>(c) * kChunk;
    advance_moments(param, m, v, grad, lo, std::min(n, lo + kChunk), k, w2[static_cast<size_t>(c)],
                    u2[static_cast<size_t>(c)]);
  }
  double w2_sum = 0, u2_sum = 0;
  for (size_t c = 0; c < nchunks; ++c) {
    w2_sum += w2[c];
    u2_sum += u2[c];
  }
  const float coeff = trust_ratio(w2_sum, u2_sum, h);
  detail::for_chunks(n, kParallelMin, 64,
                     [&](size_t lo, size_t hi) { apply_update(param, m, v, lo, hi, k, coeff); });
  return coeff;
}

float lamb_step_reference(float* param, float* m, float* v, const float* grad, size_t n,
                          const LambHyper& h, int64_t step, float grad_multiplier) {
  const LambConsts k = make_consts(h, step, grad_multiplier);
  double w2 = 0, u2 = 0;
  advance_moments(param, m, v, grad, 0, n, k, w2, u2);
  const float coeff = trust_ratio(w2, u2, h);
  apply_update(param, m, v, 0, n, k, coeff);
  return coeff;
}

}  // namespace dsactor::kernels::cpu
