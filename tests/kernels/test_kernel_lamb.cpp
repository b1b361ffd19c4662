// Lamb (DeepSpeed's FusedLamb) against its formula worked out in double for small tensors,
// the trust ratio's bounds, and the parallel pass against the plain one.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/lamb.h"
#include "tests/kernels/kernel_test_util.h"

namespace dsactor::kernels::cpu {
namespace {

using test::bit_equal;
using test::expect_close;
using test::random_floats;
using test::with_threads;

struct Expected {
  std::vector<double> p, m, v;
  double coeff;
};

// FusedLamb's step in double, written from csrc/lamb/fused_lamb_cuda_kernel.cu: moments,
// update = m / denom + wd * p, coeff = clamp(||p|| / ||update||), p -= step_size * coeff * u.
Expected by_formula(std::vector<double> p, std::vector<double> m, std::vector<double> v,
                    const std::vector<double>& grad, const LambHyper& h, int step, double gmul) {
  const double b1 = h.beta1, b2 = h.beta2, eps = h.eps;
  std::vector<double> u(p.size());
  double w2 = 0, u2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = grad[i] * gmul;
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    const double denom = h.eps_inside_sqrt ? std::sqrt(v[i] + eps) : std::sqrt(v[i]) + eps;
    u[i] = m[i] / denom + h.weight_decay * p[i];
    w2 += p[i] * p[i];
    u2 += u[i] * u[i];
  }
  double coeff = 1.0;
  if (w2 > 0 && u2 > 0)
    coeff = std::min<double>(h.max_coeff, std::max<double>(h.min_coeff, std::sqrt(w2 / u2)));
  const double step_size = h.bias_correction
                               ? h.lr * std::sqrt(1 - std::pow(b2, step)) / (1 - std::pow(b1, step))
                               : h.lr;
  for (size_t i = 0; i < p.size(); ++i) p[i] -= step_size * coeff * u[i];
  return {p, m, v, coeff};
}

std::vector<double> doubles(const std::vector<float>& f) {
  return {f.begin(), f.end()};
}

void expect_step_matches_formula(std::vector<float> p, std::vector<float> m, std::vector<float> v,
                                 const std::vector<float>& g, const LambHyper& h, int step,
                                 float gmul) {
  const Expected want = by_formula(doubles(p), doubles(m), doubles(v), doubles(g), h, step, gmul);
  const float coeff = lamb_step(p.data(), m.data(), v.data(), g.data(), p.size(), h, step, gmul);
  EXPECT_NEAR(coeff, want.coeff, 1e-5 * want.coeff);
  expect_close(m, want.m, 1e-9, 1e-5, "m");
  expect_close(v, want.v, 1e-12, 1e-5, "v");
  expect_close(p, want.p, 1e-7, 1e-5, "param");
}

TEST(KernelLamb, FirstAndLaterStepsFollowTheFormula) {
  LambHyper h;
  h.lr = 0.01f;
  h.beta1 = 0.9f;
  h.beta2 = 0.99f;
  h.eps = 1e-6f;
  h.weight_decay = 0.01f;
  const std::vector<float> p = {1.0f, -2.0f, 0.5f, 0.25f}, g = {0.1f, -0.2f, 0.3f, 0.0f};
  expect_step_matches_formula(p, {0, 0, 0, 0}, {0, 0, 0, 0}, g, h, 1, 0.5f);
  // A later step: moments carried in, bias correction of step 7.
  expect_step_matches_formula(p, {0.01f, -0.02f, 0.0f, 0.005f}, {1e-4f, 4e-4f, 2e-4f, 1e-6f}, g, h,
                              7, 0.25f);
  h.bias_correction = false;
  h.eps_inside_sqrt = true;
  expect_step_matches_formula(p, {0.01f, -0.02f, 0.0f, 0.005f}, {1e-4f, 4e-4f, 2e-4f, 1e-6f}, g, h,
                              7, 1.0f);
}

TEST(KernelLamb, TrustRatioIsClampedAndOneWhenANormIsZero) {
  LambHyper h;
  h.max_coeff = 2.0f;
  h.min_coeff = 0.5f;
  const std::vector<float> g = {0.3f, -0.1f, 0.2f};
  std::vector<float> m(3, 0), v(3, 0);
  // Step 1: |update| is about 1 per element, so ||p|| decides the ratio.
  std::vector<float> big = {100.0f, -50.0f, 80.0f};
  EXPECT_EQ(lamb_step(big.data(), m.data(), v.data(), g.data(), 3, h, 1, 1.0f), 2.0f);
  m.assign(3, 0);
  v.assign(3, 0);
  std::vector<float> tiny = {1e-3f, 2e-3f, -1e-3f};
  EXPECT_EQ(lamb_step(tiny.data(), m.data(), v.data(), g.data(), 3, h, 1, 1.0f), 0.5f);
  m.assign(3, 0);
  v.assign(3, 0);
  std::vector<float> zero(3, 0.0f);
  EXPECT_EQ(lamb_step(zero.data(), m.data(), v.data(), g.data(), 3, h, 1, 1.0f), 1.0f);
  // With ||p|| = 0 the step is plain: -step_size * m / (sqrt(v) + eps), about -lr * sign(g).
  EXPECT_NEAR(zero[0], -h.lr, 1e-6);
  EXPECT_NEAR(zero[1], h.lr, 1e-6);
  std::vector<float> p = {1.0f, 1.0f, 1.0f}, none(3, 0.0f);
  m.assign(3, 0);
  v.assign(3, 0);
  EXPECT_EQ(lamb_step(p.data(), m.data(), v.data(), none.data(), 3, h, 1, 1.0f), 1.0f);
  EXPECT_EQ(p, (std::vector<float>{1.0f, 1.0f, 1.0f}));  // no gradient, no decay: unchanged
}

TEST(KernelLamb, ParallelPassMatchesThePlainOneAndIgnoresTheThreadCount) {
  const size_t n = 200003;  // several chunks, parallel, a ragged end
  LambHyper h;
  h.lr = 2e-3f;
  h.weight_decay = 0.05f;
  const auto p0 = random_floats(n, 1, -1.0f, 1.0f), m0 = random_floats(n, 2, -0.01f, 0.01f),
             v0 = random_floats(n, 3, 0.0f, 1e-4f), g = random_floats(n, 4, -0.1f, 0.1f);
  auto run = [&](bool reference, int threads) {
    std::vector<float> p = p0, m = m0, v = v0;
    float coeff = 0;
    with_threads(threads, [&] {
      coeff = reference ? lamb_step_reference(p.data(), m.data(), v.data(), g.data(), n, h, 3, 0.5f)
                        : lamb_step(p.data(), m.data(), v.data(), g.data(), n, h, 3, 0.5f);
    });
    return std::make_pair(coeff, p);
  };
  const auto [c1, p1] = run(false, 1);
  const auto [c2, p2] = run(false, 2);
  EXPECT_EQ(c1, c2);
  EXPECT_TRUE(bit_equal(p1, p2));
  const auto [cr, pr] = run(true, 1);
  EXPECT_NEAR(c1, cr, 1e-6 * cr);
  expect_close(p1, std::vector<double>(pr.begin(), pr.end()), 1e-9, 1e-6, "param");
}

}  // namespace
}  // namespace dsactor::kernels::cpu
