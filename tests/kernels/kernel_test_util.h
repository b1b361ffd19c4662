#pragma once
// Shared helpers of the kernel tests: random tensors, tolerance checks, finite differences.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace dsactor::kernels::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// |got - want| <= atol + rtol*|want| elementwise, reporting the first few failures.
template <typename A, typename B>
void expect_close(const std::vector<A>& got, const std::vector<B>& want, double atol, double rtol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double w = static_cast<double>(want[i]);
    const bool ok = std::fabs(g - w) <= atol + rtol * std::fabs(w);
    if (!ok && reported < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << g << " want " << w;
      ++reported;
    }
  }
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Central differences of a scalar function of x (double), step h.
inline std::vector<double> finite_diff(std::vector<double> x,
                                       const std::function<double(const std::vector<double>&)>& f,
                                       double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// sum(out * w): the scalar loss whose gradient w.r.t. out is w.
inline double weighted_sum(const std::vector<double>& out, const std::vector<double>& w) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * w[i];
  return s;
}

// The reference backward's gradients of a kernel with input, weight and bias against central
// differences of `loss(inp, w, b)` in each argument.
template <typename Loss>
void expect_gradients_match_finite_differences(const std::vector<double>& dinp,
                                               const std::vector<double>& dw,
                                               const std::vector<double>& db,
                                               const std::vector<double>& inp,
                                               const std::vector<double>& w,
                                               const std::vector<double>& b, Loss loss) {
  expect_close(dinp, finite_diff(inp, [&](const auto& x) { return loss(x, w, b); }), 1e-7, 1e-6,
               "fd dinp");
  expect_close(dw, finite_diff(w, [&](const auto& x) { return loss(inp, x, b); }), 1e-7, 1e-6,
               "fd dweight");
  expect_close(db, finite_diff(b, [&](const auto& x) { return loss(inp, w, x); }), 1e-7, 1e-6,
               "fd dbias");
}

// Runs f with the OpenMP thread count set to n, restoring it afterwards.
template <typename F>
void with_threads(int n, F&& f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(n);
  f();
  omp_set_num_threads(before);
}

}  // namespace dsactor::kernels::test
