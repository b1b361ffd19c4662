#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/gelu.h"
#include "tests/kernels/kernel_test_util.h"

namespace dsactor::kernels::cpu {
namespace {

using test::random_floats;

double ref_gelu(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}

// The same function as x * sigmoid(2u), which keeps its relative precision in the negative
// tail where 1 + tanh(u) cancels even in double.
double ref_gelu_sigmoid_form(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return x / (1.0 + std::exp(-2.0 * s * (x + 0.044715 * x * x * x)));
}

double ref_gelu_grad(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  const double u = s * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

std::vector<float> inputs() {
  auto x = random_floats(10007, 1, -8.0f, 8.0f);  // odd length: vector tails
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-6f, 20.0f, -20.0f, 100.0f, -100.0f}) x.push_back(v);
  return x;
}

TEST(KernelGelu, ReferenceGradientMatchesFiniteDifferences) {
  std::vector<double> x = {-3.0, -1.0, -0.3, 0.0, 0.2, 1.0, 2.5};
  for (double xi : x) {
    const double h = 1e-6;
    EXPECT_NEAR(ref_gelu_grad(xi), (ref_gelu(xi + h) - ref_gelu(xi - h)) / (2 * h), 1e-8) << xi;
  }
}

TEST(KernelGelu, SigmoidFormIsTheTanhFormula) {
  for (double x : {-3.0, -1.0, -0.3, 0.0, 0.2, 1.0, 2.5, 6.0}) {
    EXPECT_NEAR(ref_gelu_sigmoid_form(x), ref_gelu(x), 1e-15) << x;
  }
}

TEST(KernelGelu, ForwardMatchesReference) {
  const auto x = inputs();
  std::vector<float> out(x.size());
  gelu_forward(out.data(), x.data(), x.size());
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = ref_gelu_sigmoid_form(x[i]);
  // Relative, even in the tail: there the float rounding of u (~6e-8 relative) is amplified
  // by |2u| <= ~200 through exp, hence 1e-5 rather than a few ulp.
  test::expect_close(out, want, 1e-30, 1e-5, "gelu");
  for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(std::isfinite(out[i]));
}

TEST(KernelGelu, BackwardAccumulatesReferenceGradient) {
  const auto x = inputs();
  const auto dout = random_floats(x.size(), 2);
  const auto g0 = random_floats(x.size(), 3);
  std::vector<float> dinp = g0;
  gelu_backward(dinp.data(), x.data(), dout.data(), x.size());
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = g0[i] + ref_gelu_grad(x[i]) * dout[i];
  test::expect_close(dinp, want, 1e-6, 2e-6, "dinp");
}

TEST(KernelGelu, DeterministicAcrossThreadCounts) {
  const auto x = random_floats(300001, 4, -5.0f, 5.0f), dout = random_floats(300001, 5);
  auto run = [&](int threads) {
    std::vector<float> out(x.size()), dinp(x.size(), 0.25f);
    test::with_threads(threads, [&] {
      gelu_forward(out.data(), x.data(), x.size());
      gelu_backward(dinp.data(), x.data(), dout.data(), x.size());
    });
    out.insert(out.end(), dinp.begin(), dinp.end());
    return out;
  };
  const auto a = run(2), b = run(2), c = run(1);
  EXPECT_TRUE(test::bit_equal(a, b));
  EXPECT_TRUE(test::bit_equal(a, c));
}

}  // namespace
}  // namespace dsactor::kernels::cpu
