#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/threads.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace dsactor::kernels::cpu {

namespace {
constexpr float kEps = 1e-5f;
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  adopt_threads();
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* o = out + static_cast<size_t>(n) * C;
    // omp simd reductions fix the association order at compile time: deterministic.
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; ++c) s += x[c];
    const float m = s / static_cast<float>(C);
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) {
      const float d = x[c] - m;
      v += d * d;
    }
    const float r = 1.0f / std::sqrt(v / static_cast<float>(C) + kEps);
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * r * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  // dinp: rows are independent.
  adopt_threads();
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    const float* d = dout + static_cast<size_t>(n) * C;
    float* di = dinp + static_cast<size_t>(n) * C;
    const float m = mean[n];
    const float r = rstd[n];
    float dnorm_mean = 0.0f;
    float dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int c = 0; c < C; ++c) {
      const float dnorm = weight[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * ((x[c] - m) * r);
    }
    dnorm_mean /= static_cast<float>(C);
    dnorm_norm_mean /= static_cast<float>(C);
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * r;
      const float dnorm = weight[c] * d[c];
      di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
    }
  }
  // dweight, dbias: sums over rows. Each thread owns a block of channels and adds the rows
  // in order, so the result is the same for any thread count.
  constexpr int kBlock = 64;
  const int nblocks = (C + kBlock - 1) / kBlock;
  adopt_threads();
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kBlock;
    const int c1 = std::min(C, c0 + kBlock);
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<size_t>(n) * C;
      const float* d = dout + static_cast<size_t>(n) * C;
      const float m = mean[n];
      const float r = rstd[n];
#pragma omp simd
      for (int c = c0; c < c1; ++c) {
        dbias[c] += d[c];
        dweight[c] += (x[c] - m) * r * d[c];
      }
    }
  }
}

}  // namespace dsactor::kernels::cpu
