#include "kernels/cpu/gelu.h"

#include <bit>
#include <cstdint>

#include "kernels/cpu/detail.h"

namespace dsactor::kernels::cpu {

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kCubeCoef = 0.044715f;

// exp(-2u), u = sqrt(2/pi) (x + 0.044715 x^3), capped at 2^120 (reached for x < ~-8.7,
// where GELU and its gradient are below 1e-35 anyway). The cap keeps sigmoid(2u) =
// 1/(1+exp(-2u)) >= 2^-120 and the products formed from it out of the subnormal range,
// whose arithmetic is several times slower. The cap is an integer min on the bits (en is
// >= 0), because a float select would stop the loop from vectorizing (see detail.h).
inline float exp_neg2u(float x) {
  constexpr uint32_t kCap = 0x7b800000u;  // 2^120
  const float en = detail::exp_vec(-2.0f * kGeluScale * (x + kCubeCoef * x * x * x));
  const uint32_t b = std::bit_cast<uint32_t>(en);
  return std::bit_cast<float>(b > kCap ? kCap : b);
}
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
  const int64_t N = static_cast<int64_t>(n);
  adopt_threads();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float x = inp[i];
    // 0.5 x (1 + tanh(u)) == x * sigmoid(2u): no cancellation in the negative tail.
    out[i] = x / (1.0f + exp_neg2u(x));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  const int64_t N = static_cast<int64_t>(n);
  adopt_threads();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float x = inp[i];
    // With sg = sigmoid(2u): 0.5 (1 + tanh u) = sg and 0.5 sech^2 u = 2 sg (1 - sg), where
    // 1 - sg = en * sg is formed without cancellation.
    const float en = exp_neg2u(x);
    const float sg = 1.0f / (1.0f + en);
    const float half_sech2 = 2.0f * sg * (en * sg);
    const float local_grad = sg + x * half_sech2 * kGeluScale * (1.0f + 3.0f * kCubeCoef * x * x);
    dinp[i] += local_grad * dout[i];
  }
}

}  // namespace dsactor::kernels::cpu
