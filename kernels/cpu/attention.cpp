#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/detail.h"

namespace dsactor::kernels::cpu {

// The (T,T) products go through sgemm one (b,h) at a time from this thread (sgemm must not
// run inside an OpenMP region, see matmul.cpp); the causal softmax and its backward, which
// are row-local, run as OpenMP loops over all B*NH*T rows between the sgemm phases.

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t TT = static_cast<size_t>(T) * T;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + static_cast<size_t>(b) * T * C3 + h * hs;
      const float* k = q + C;
      float* a = att + (static_cast<size_t>(b) * NH + h) * TT;
      // preatt (T,T) = scale * q (T,hs) @ k^T; the part above the diagonal is discarded.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, a,
                  T);
    }
  }
  const int rows = B * NH * T;
#pragma omp parallel for schedule(static)
  for (int row = 0; row < rows; ++row) {
    const int t = row % T;
    float* a = att + static_cast<size_t>(row) * T;
    float maxv = a[0];
    for (int t2 = 1; t2 <= t; ++t2) maxv = std::max(maxv, a[t2]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int t2 = 0; t2 <= t; ++t2) {
      const float e = detail::exp_vec(a[t2] - maxv);
      a[t2] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
    for (int t2 = t + 1; t2 < T; ++t2) a[t2] = 0.0f;
  }
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* v = qkv + static_cast<size_t>(b) * T * C3 + 2 * C + h * hs;
      const float* a = att + (static_cast<size_t>(b) * NH + h) * TT;
      float* o = out + static_cast<size_t>(b) * T * C + h * hs;
      // out (T,hs) = att (T,T) @ v (T,hs); att is zero above the diagonal.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3, 0.0f, o,
                  C);
    }
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t TT = static_cast<size_t>(T) * T;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const size_t bh = static_cast<size_t>(b) * NH + h;
      const float* v = qkv + static_cast<size_t>(b) * T * C3 + 2 * C + h * hs;
      float* dv = dqkv + static_cast<size_t>(b) * T * C3 + 2 * C + h * hs;
      const float* d = dout + static_cast<size_t>(b) * T * C + h * hs;
      const float* a = att + bh * TT;
      float* datt = scratch + bh * TT;
      // datt (T,T) = dout (T,hs) @ v^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, v, C3, 0.0f, datt,
                  T);
      // dv (T,hs) += att^T (T,T) @ dout (T,hs)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, d, C, 1.0f, dv,
                  C3);
    }
  }
  // Softmax backward in place: dpreatt = att * (datt - sum(att * datt)), zero above the
  // diagonal (those entries of datt were computed but are not part of the causal softmax).
  const int rows = B * NH * T;
#pragma omp parallel for schedule(static)
  for (int row = 0; row < rows; ++row) {
    const int t = row % T;
    const float* a = att + static_cast<size_t>(row) * T;
    float* g = scratch + static_cast<size_t>(row) * T;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int t2 = 0; t2 <= t; ++t2) dot += a[t2] * g[t2];
#pragma omp simd
    for (int t2 = 0; t2 <= t; ++t2) g[t2] = a[t2] * (g[t2] - dot);
    for (int t2 = t + 1; t2 < T; ++t2) g[t2] = 0.0f;
  }
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const size_t bh = static_cast<size_t>(b) * NH + h;
      const float* q = qkv + static_cast<size_t>(b) * T * C3 + h * hs;
      const float* k = q + C;
      float* dq = dqkv + static_cast<size_t>(b) * T * C3 + h * hs;
      float* dk = dq + C;
      const float* dpre = scratch + bh * TT;
      // preatt = scale * q @ k^T, so dq += scale * dpre @ k and dk += scale * dpre^T @ q.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, dpre, T, k, C3, 1.0f,
                  dq, C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, dpre, T, q, C3, 1.0f,
                  dk, C3);
    }
  }
}

}  // namespace dsactor::kernels::cpu
