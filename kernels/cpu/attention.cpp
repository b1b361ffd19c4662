#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/detail.h"

namespace dsactor::kernels::cpu {

// One OpenMP region over the B*NH heads, each doing its whole (T,T) pipeline: sgemm,
// causal softmax, sgemm. OpenBLAS's OpenMP build runs sgemm single-threaded inside a
// parallel region (omp_in_parallel), so this is safe, deterministic (a head's arithmetic
// never depends on the thread count) and costs one fork/join per call instead of one per
// (b,h) sgemm, which on a loaded 2-core box cost a scheduler quantum each.

namespace {

// Causal softmax of row t of a (T,T) score matrix in place; zero above the diagonal.
inline void causal_softmax_row(float* a, int t, int T) {
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

// The shapes of one call and where head bh = (b, h) finds its rows: q, k and v are column
// blocks of one (T, 3C) row of qkv, the head's output a column block of a (T, C) row, and its
// (T, T) attention matrix a slab of its own.
struct Heads {
  int B, T, C, NH;
  int hs = C / NH;
  int C3 = 3 * C;
  float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  size_t TT = static_cast<size_t>(T) * T;
  int count() const { return B * NH; }
  size_t qkv_offset(int bh) const {
    return static_cast<size_t>(bh / NH) * T * C3 + static_cast<size_t>(bh % NH) * hs;
  }
  size_t out_offset(int bh) const {
    return static_cast<size_t>(bh / NH) * T * C + static_cast<size_t>(bh % NH) * hs;
  }
  size_t att_offset(int bh) const { return static_cast<size_t>(bh) * TT; }
};

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const Heads H{B, T, C, NH};
  const int hs = H.hs, C3 = H.C3;
  adopt_threads();
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < H.count(); ++bh) {
    const float* q = qkv + H.qkv_offset(bh);
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att + H.att_offset(bh);
    float* o = out + H.out_offset(bh);
    // preatt (T,T) = scale * q (T,hs) @ k^T; the part above the diagonal is discarded.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, H.scale, q, C3, k, C3, 0.0f, a,
                T);
    for (int t = 0; t < T; ++t) causal_softmax_row(a + static_cast<size_t>(t) * T, t, T);
    // out (T,hs) = att (T,T) @ v (T,hs); att is zero above the diagonal.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3, 0.0f, o, C);
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  const Heads H{B, T, C, NH};
  const int hs = H.hs, C3 = H.C3;
  const float scale = H.scale;
  // Each head writes only its own channels of dq, dk, dv in its own batch row: no overlap.
  adopt_threads();
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < H.count(); ++bh) {
    const float* q = qkv + H.qkv_offset(bh);
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + H.qkv_offset(bh);
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* d = dout + H.out_offset(bh);
    const float* a = att + H.att_offset(bh);
    float* g = scratch + H.att_offset(bh);
    // datt (T,T) = dout (T,hs) @ v^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, v, C3, 0.0f, g, T);
    // dv (T,hs) += att^T (T,T) @ dout (T,hs)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, d, C, 1.0f, dv, C3);
    // Softmax backward in place: dpreatt = att * (datt - sum(att * datt)), zero above the
    // diagonal (those entries of datt were computed but are not part of the causal softmax).
    for (int t = 0; t < T; ++t) {
      const float* ar = a + static_cast<size_t>(t) * T;
      float* gr = g + static_cast<size_t>(t) * T;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int t2 = 0; t2 <= t; ++t2) dot += ar[t2] * gr[t2];
#pragma omp simd
      for (int t2 = 0; t2 <= t; ++t2) gr[t2] = ar[t2] * (gr[t2] - dot);
      for (int t2 = t + 1; t2 < T; ++t2) gr[t2] = 0.0f;
    }
    // preatt = scale * q @ k^T, so dq += scale * dpre @ k and dk += scale * dpre^T @ q.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, g, T, k, C3, 1.0f, dq,
                C3);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, g, T, q, C3, 1.0f, dk,
                C3);
  }
}

}  // namespace dsactor::kernels::cpu
