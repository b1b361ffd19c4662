#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cast.h"

namespace dsactor::kernels::cpu {

// Hyper-parameters with DeepSpeed's semantics (deepspeed/ops/adam/cpu_adam.py, FusedAdam):
// adamw_mode = decoupled weight decay (param -= lr*wd*param) instead of L2 added to the grad.
struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw_mode = true;
  bool bias_correction = true;
};

// Optional half-precision copy of the updated params, written in the same sweep.
struct HalfCopy {
  uint16_t* out = nullptr;
  HalfKind kind = HalfKind::kBF16;
};

// The grad_multiplier of a step, as DeepSpeed's fp16 optimizer forms it: the gradient is
// unscaled by loss_scale and multiplied by clip_coef in (0, 1] (1/clip when the unscaled
// global norm exceeds gradient_clipping, else 1). Divided in double and rounded once to
// float; the trainer's local step and the offload service both use exactly this, so an
// offloaded step is bit-identical to a local one.
inline float grad_multiplier(double clip_coef, double loss_scale) {
  return static_cast<float>(clip_coef / loss_scale);
}

// DeepSpeed's clip coefficient from the unscaled global gradient norm: with
// clip = (norm + 1e-6) / max_norm, gradients are scaled by 1/clip when clip > 1.
// max_norm <= 0 disables clipping.
inline double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double clip = (norm + 1e-6) / max_norm;
  return clip > 1 ? 1.0 / clip : 1.0;
}

// One fused Adam/AdamW pass over n elements: g = grad * grad_multiplier (the product of
// 1/loss_scale and the clip coefficient, computed once by the caller); update m, v, param;
// write the half copy if asked, or else an fp32 copy of the updated params into `fp32_copy`
// if given. `fp32_copy` may be the memory `grad` points to (an offload service publishing
// the parameters into the arena slot the gradient came in): each element's gradient is read
// before its copy is written. step is the 1-based count of steps including this one.
// Dispatches at run time to AVX-512, AVX2 or scalar; all three give bit-identical results.
// Both copies at once is a std::invalid_argument.
void adam_step(float* param, float* m, float* v, const float* grad, size_t n, const AdamHyper& h,
               int64_t step, float grad_multiplier, HalfCopy half = {}, float* fp32_copy = nullptr);
// The straightforward scalar reference that the SIMD paths are tested against.
void adam_step_reference(float* param, float* m, float* v, const float* grad, size_t n,
                         const AdamHyper& h, int64_t step, float grad_multiplier,
                         HalfCopy half = {}, float* fp32_copy = nullptr);
// Which path adam_step uses on this CPU: "avx512", "avx2" or "scalar".
const char* adam_isa();
// adam_step forced onto one path ("avx512", "avx2" or "scalar"), so tests and benchmarks
// can reach every path on one machine. Throws std::invalid_argument for an unknown name or
// a path this CPU cannot run.
void adam_step_isa(const char* isa, float* param, float* m, float* v, const float* grad, size_t n,
                   const AdamHyper& h, int64_t step, float grad_multiplier, HalfCopy half = {},
                   float* fp32_copy = nullptr);

// Sum of squares in double and whether any element is inf/NaN. For global-norm clipping and
// the fp16 overflow vote. One order of additions, whatever the thread count or vector path:
// 4096-element blocks added in order, each block as 32 interleaved sums (element i into sum
// i % 32, in element order) folded in halves (sum j += sum j + w, w = 16, 8, 4, 2, 1).
struct GradStats {
  double sum_squares = 0.0;
  bool nonfinite = false;
};
GradStats grad_stats(const float* grad, size_t n);
// Whether any element is -0 (0 + g would turn it into +0, which a sum into a zeroed buffer
// does and an update read straight from the gradient would not).
bool has_negative_zero(const float* grad, size_t n);
// grad_stats and has_negative_zero in one pass over the gradient (each block checked for -0
// while it is in cache), on the kernels' threads: what a trainer gives its service with a
// gradient the service keeps where it lies (PushGradients.givenStats).
struct GradStatsAndSigns {
  GradStats stats;
  bool negative_zero = false;
};
GradStatsAndSigns grad_stats_and_negative_zero(const float* grad, size_t n);

// adam_step and grad_stats in one pass over the gradient, for an update taken as the
// gradient arrives (an offload service's update on the push): each of grad_stats' blocks
// has its squares summed, then is updated while it is in cache. Returns grad_stats(grad, n)
// bit for bit, and the update is adam_step's over 0 + grad (a -0 counts as +0, as in the sum
// a push is otherwise added into) bit for bit. The update runs whatever the stats say.
// `fp32_copy` as adam_step's (it may be the gradient's own memory).
GradStats adam_step_with_stats(float* param, float* m, float* v, const float* grad, size_t n,
                               const AdamHyper& h, int64_t step, float grad_multiplier,
                               float* fp32_copy = nullptr);
// grad_stats on one vector path ("avx512", "avx2" or "scalar"; adam_step_isa's rules), so
// tests can check that every path returns the same bits.
GradStats grad_stats_isa(const char* isa, const float* grad, size_t n);

}  // namespace dsactor::kernels::cpu
