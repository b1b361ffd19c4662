#include "kernels/cpu/crossentropy.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/detail.h"

namespace dsactor::kernels::cpu {

namespace {

float row_max(const float* x, int V) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int i = 0; i < V; ++i) m = std::max(m, x[i]);
  return m;
}

}  // namespace

void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                          int Vp) {
  adopt_threads();
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<size_t>(n) * Vp;
    const float m = row_max(x, V);
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; ++i) sum += static_cast<double>(detail::exp_vec(x[i] - m));
    // loss = log(sum exp(x - m)) + m - x[target]
    losses[n] = static_cast<float>(std::log(sum) - (static_cast<double>(x[targets[n]]) - m));
  }
}

void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, int N, int V, int Vp, float dloss) {
  // dlogits may alias logits: everything needed from a row of logits (max, target logit) is
  // read before the row is overwritten, and the overwrite reads each element only at its
  // own index.
  adopt_threads();
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<size_t>(n) * Vp;
    float* d = dlogits + static_cast<size_t>(n) * Vp;
    const int target = targets[n];
    const float m = row_max(x, V);
    const float x_target = x[target];
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; ++i) {
      const float e = detail::exp_vec(x[i] - m);
      d[i] = e;
      sum += static_cast<double>(e);
    }
    losses[n] = static_cast<float>(std::log(sum) - (static_cast<double>(x_target) - m));
    const float scale = static_cast<float>(static_cast<double>(dloss) / sum);
#pragma omp simd
    for (int i = 0; i < V; ++i) d[i] *= scale;
    d[target] -= dloss;
    for (int i = V; i < Vp; ++i) d[i] = 0.0f;
  }
}

void softmax_row(float* probs, const float* logits, int V, float temperature) {
  const float inv_t = 1.0f / temperature;
  float m = logits[0] * inv_t;
  for (int i = 1; i < V; ++i) m = std::max(m, logits[i] * inv_t);
  double sum = 0.0;
  for (int i = 0; i < V; ++i) {
    const float e = detail::exp_vec(logits[i] * inv_t - m);
    probs[i] = e;
    sum += static_cast<double>(e);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int i = 0; i < V; ++i) probs[i] *= inv;
}

}  // namespace dsactor::kernels::cpu
