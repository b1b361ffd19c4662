#include "kernels/cpu/residual.h"
#include "kernels/cpu/threads.h"

#include <cstdint>

namespace dsactor::kernels::cpu {

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  const int64_t N = static_cast<int64_t>(n);
  adopt_threads();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
  const int64_t N = static_cast<int64_t>(n);
  adopt_threads();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

}  // namespace dsactor::kernels::cpu
