#pragma once
// DeepSpeed's FusedLamb (deepspeed/ops/lamb/fused_lamb.py, csrc/lamb/fused_lamb_cuda_kernel.cu)
// on the CPU: Adam's moments, an update with the weight decay inside it, and a trust ratio
// ||param|| / ||update|| per parameter tensor that scales the step.
#include <cstddef>
#include <cstdint>

namespace dsactor::kernels::cpu {

// FusedLamb's arguments and defaults.
struct LambHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool bias_correction = true;
  float max_coeff = 10.0f;  // bounds of the trust ratio
  float min_coeff = 0.01f;
  bool eps_inside_sqrt = false;  // sqrt(v + eps) instead of sqrt(v) + eps
};

// One Lamb step over ONE parameter tensor of n elements (FusedLamb steps each torch
// parameter on its own, and the trust ratio is that tensor's):
//   g = grad * grad_multiplier               (1/loss_scale times the clip coefficient)
//   m = beta1 m + (1 - beta1) g,  v = beta2 v + (1 - beta2) g^2
//   update = m / (sqrt(v) + eps) + weight_decay * param     (sqrt(v + eps) with eps_inside_sqrt)
//   coeff = ||param|| / ||update||, clamped to [min_coeff, max_coeff]; 1 if either norm is 0
//   param -= step_size * coeff * update,
//   step_size = lr * sqrt(1 - beta2^step) / (1 - beta1^step)  (lr without bias correction)
// The moments are not bias-corrected inside the update: the correction is step_size's, as
// in the CUDA kernel. step is 1-based. Returns coeff. The norms are summed in double over
// fixed 4096-element chunks added in order, so the result does not depend on the thread
// count.
float lamb_step(float* param, float* m, float* v, const float* grad, size_t n, const LambHyper& h,
                int64_t step, float grad_multiplier);

// The same step written plainly (one thread, the norms summed element by element), which
// lamb_step is tested against.
float lamb_step_reference(float* param, float* m, float* v, const float* grad, size_t n,
                          const LambHyper& h, int64_t step, float grad_multiplier);

}  // namespace dsactor::kernels::cpu
