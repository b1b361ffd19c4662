#include "kernels/cpu/encoder.h"
#include "kernels/cpu/threads.h"

#include <algorithm>

namespace dsactor::kernels::cpu {

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C) {
  const int N = B * T;
  adopt_threads();
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < N; ++bt) {
    const int t = bt % T;
    float* o = out + static_cast<size_t>(bt) * C;
    const float* e = wte + static_cast<size_t>(tokens[bt]) * C;
    const float* p = wpe + static_cast<size_t>(t) * C;
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C) {
  // A token can repeat, so rows of dwte receive several contributions. Each thread owns a
  // fixed block of channels and walks the positions in (b,t) order: every element is
  // summed in the same order whatever the thread count, with no atomics.
  constexpr int kBlock = 64;
  const int nblocks = (C + kBlock - 1) / kBlock;
  const int N = B * T;
  adopt_threads();
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kBlock;
    const int c1 = std::min(C, c0 + kBlock);
    for (int bt = 0; bt < N; ++bt) {
      const int t = bt % T;
      const float* d = dout + static_cast<size_t>(bt) * C;
      float* we = dwte + static_cast<size_t>(tokens[bt]) * C;
      float* pe = dwpe + static_cast<size_t>(t) * C;
      for (int c = c0; c < c1; ++c) {
        we[c] += d[c];
        pe[c] += d[c];
      }
    }
  }
}

}  // namespace dsactor::kernels::cpu
