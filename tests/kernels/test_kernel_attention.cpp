#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/attention.h"
#include "tests/kernels/kernel_test_util.h"

namespace dsactor::kernels::cpu {
namespace {

using test::expect_close;
using test::random_floats;
using test::to_double;

struct Shape {
  int B, T, C, NH;
  size_t qkv() const { return static_cast<size_t>(B) * T * 3 * C; }
  size_t out() const { return static_cast<size_t>(B) * T * C; }
  size_t att() const { return static_cast<size_t>(B) * NH * T * T; }
};

// Naive causal attention in double: loops exactly as the math reads.
void ref_forward(std::vector<double>& out, std::vector<double>& att, const std::vector<double>& qkv,
                 const Shape& s) {
  const int hs = s.C / s.NH, C3 = 3 * s.C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  out.assign(s.out(), 0);
  att.assign(s.att(), 0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const double* q = &qkv[(b * s.T + t) * C3 + h * hs];
        double* a = &att[((b * s.NH + h) * s.T + t) * s.T];
        double mx = -1e300;
        for (int t2 = 0; t2 <= t; ++t2) {
          const double* k = &qkv[(b * s.T + t2) * C3 + s.C + h * hs];
          double dot = 0;
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          a[t2] = dot * scale;
          mx = std::max(mx, a[t2]);
        }
        double sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) sum += (a[t2] = std::exp(a[t2] - mx));
        for (int t2 = 0; t2 <= t; ++t2) a[t2] /= sum;
        double* o = &out[(b * s.T + t) * s.C + h * hs];
        for (int t2 = 0; t2 <= t; ++t2) {
          const double* v = &qkv[(b * s.T + t2) * C3 + 2 * s.C + h * hs];
          for (int i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
        }
      }
}

std::vector<double> ref_backward(const std::vector<double>& dout, const std::vector<double>& qkv,
                                 const Shape& s) {
  const int hs = s.C / s.NH, C3 = 3 * s.C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> out, att, dqkv(s.qkv(), 0);
  ref_forward(out, att, qkv, s);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const double* a = &att[((b * s.NH + h) * s.T + t) * s.T];
        const double* d = &dout[(b * s.T + t) * s.C + h * hs];
        std::vector<double> datt(t + 1);
        for (int t2 = 0; t2 <= t; ++t2) {
          const int vo = (b * s.T + t2) * C3 + 2 * s.C + h * hs;
          for (int i = 0; i < hs; ++i) {
            datt[t2] += d[i] * qkv[vo + i];
            dqkv[vo + i] += a[t2] * d[i];
          }
        }
        double dot = 0;
        for (int t2 = 0; t2 <= t; ++t2) dot += a[t2] * datt[t2];
        const int qo = (b * s.T + t) * C3 + h * hs;
        for (int t2 = 0; t2 <= t; ++t2) {
          const double dpre = a[t2] * (datt[t2] - dot) * scale;
          const int ko = (b * s.T + t2) * C3 + s.C + h * hs;
          for (int i = 0; i < hs; ++i) {
            dqkv[qo + i] += dpre * qkv[ko + i];
            dqkv[ko + i] += dpre * qkv[qo + i];
          }
        }
      }
  return dqkv;
}

TEST(KernelAttention, ReferenceBackwardMatchesFiniteDifferences) {
  const Shape s{2, 5, 8, 2};
  const auto qkv = to_double(random_floats(s.qkv(), 1));
  const auto wts = to_double(random_floats(s.out(), 2));
  const auto dqkv = ref_backward(wts, qkv, s);
  const auto fd = test::finite_diff(qkv, [&](const std::vector<double>& x) {
    std::vector<double> out, att;
    ref_forward(out, att, x, s);
    return test::weighted_sum(out, wts);
  });
  expect_close(dqkv, fd, 1e-7, 1e-6, "fd dqkv");
}

void check_against_reference(const Shape& s, uint32_t seed) {
  const auto qkv = random_floats(s.qkv(), seed, -2.0f, 2.0f);
  const auto dout = random_floats(s.out(), seed + 1);
  std::vector<float> out(s.out(), 7.0f), att(s.att(), 7.0f);  // garbage: overwritten
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  std::vector<double> rout, ratt;
  ref_forward(rout, ratt, to_double(qkv), s);
  expect_close(out, rout, 1e-5, 1e-5, "out");
  expect_close(att, ratt, 1e-6, 1e-5, "att (zero above the diagonal)");

  const auto g0 = random_floats(s.qkv(), seed + 2);
  std::vector<float> dqkv = g0, scratch(s.att(), 7.0f);
  attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T,
                     s.C, s.NH);
  auto want = ref_backward(to_double(dout), to_double(qkv), s);
  for (size_t i = 0; i < want.size(); ++i) want[i] += g0[i];  // accumulates
  expect_close(dqkv, want, 1e-5, 1e-4, "dqkv");
}

TEST(KernelAttention, MatchesReferenceSmall) {
  check_against_reference({2, 5, 8, 2}, 10);
}
TEST(KernelAttention, MatchesReferenceSingleToken) {
  check_against_reference({3, 1, 12, 3}, 20);
}
TEST(KernelAttention, MatchesReferenceLarger) {
  check_against_reference({2, 33, 64, 4}, 30);
}

TEST(KernelAttention, DeterministicAcrossRuns) {
  const Shape s{2, 40, 64, 4};
  const auto qkv = random_floats(s.qkv(), 3), dout = random_floats(s.out(), 4);
  auto run = [&](int threads) {
    std::vector<float> out(s.out()), att(s.att()), dqkv(s.qkv(), 0.5f), scratch(s.att());
    test::with_threads(threads, [&] {
      attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
      attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T,
                         s.C, s.NH);
    });
    out.insert(out.end(), att.begin(), att.end());
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  };
  const auto a = run(2), b = run(2);
  EXPECT_TRUE(test::bit_equal(a, b));
}

}  // namespace
}  // namespace dsactor::kernels::cpu
