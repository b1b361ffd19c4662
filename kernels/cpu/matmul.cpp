#include "kernels/cpu/matmul.h"
#include "kernels/cpu/threads.h"

#include <cblas.h>

#include <algorithm>
#include <cstddef>

namespace dsactor::kernels::cpu {

// sgemm is never called inside an OpenMP region: the OpenMP build of OpenBLAS would run
// it single-threaded (or nest). Its own threading is used instead.

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  adopt_threads();  // sgemm's team follows this thread's OpenMP count
  float beta = 0.0f;
  if (bias != nullptr) {
    adopt_threads();
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      float* o = out + static_cast<size_t>(n) * OC;
      for (int o_ = 0; o_ < OC; ++o_) o[o_] = bias[o_];
    }
    beta = 1.0f;
  }
  // out (N,OC) = inp (N,C) @ weight^T, weight (OC,C).
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out,
              OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  if (N <= 0) return;
  adopt_threads();  // sgemm's team follows this thread's OpenMP count
  if (dinp != nullptr) {
    // dinp (N,C) += dout (N,OC) @ weight (OC,C)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                1.0f, dinp, C);
  }
  if (dweight != nullptr) {
    // dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                dweight, C);
  }
  if (dbias != nullptr) {
    // Column sums: each thread owns a block of output channels and adds rows in order, so
    // the result does not depend on scheduling.
    constexpr int kBlock = 64;
    const int nblocks = (OC + kBlock - 1) / kBlock;
    adopt_threads();
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; ++blk) {
      const int o0 = blk * kBlock;
      const int o1 = std::min(OC, o0 + kBlock);
      for (int n = 0; n < N; ++n) {
        const float* d = dout + static_cast<size_t>(n) * OC;
        for (int o = o0; o < o1; ++o) dbias[o] += d[o];
      }
    }
  }
}

}  // namespace dsactor::kernels::cpu
