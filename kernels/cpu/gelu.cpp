#include "kernels/cpu/gelu.h"

#include <cstdint>

#include "kernels/cpu/detail.h"

namespace dsactor::kernels::cpu {

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kCubeCoef = 0.044715f;
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
  const int64_t N = static_cast<int64_t>(n);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float x = inp[i];
    const float cube = kCubeCoef * x * x * x;
    out[i] = 0.5f * x * (1.0f + detail::tanh_vec(kGeluScale * (x + cube)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  const int64_t N = static_cast<int64_t>(n);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float x = inp[i];
    const float cube = kCubeCoef * x * x * x;
    const float th = detail::tanh_vec(kGeluScale * (x + cube));
    const float sech2 = 1.0f - th * th;  // 1/cosh^2
    const float local_grad =
        0.5f * (1.0f + th) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * kCubeCoef * x * x);
    dinp[i] += local_grad * dout[i];
  }
}

}  // namespace dsactor::kernels::cpu
