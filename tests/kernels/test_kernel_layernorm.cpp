#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/layernorm.h"
#include "tests/kernels/kernel_test_util.h"

namespace dsactor::kernels::cpu {
namespace {

using test::expect_close;
using test::random_floats;
using test::to_double;

// Naive double references.
void ref_forward(std::vector<double>& out, std::vector<double>& mean, std::vector<double>& rstd,
                 const std::vector<double>& inp, const std::vector<double>& w,
                 const std::vector<double>& b, int N, int C) {
  out.assign(static_cast<size_t>(N) * C, 0);
  mean.assign(N, 0);
  rstd.assign(N, 0);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += inp[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (inp[n * C + c] - m) * (inp[n * C + c] - m);
    v /= C;
    const double r = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c) out[n * C + c] = (inp[n * C + c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

void ref_backward(std::vector<double>& dinp, std::vector<double>& dw, std::vector<double>& db,
                  const std::vector<double>& dout, const std::vector<double>& inp,
                  const std::vector<double>& w, int N, int C) {
  std::vector<double> out, mean, rstd, b(C, 0.0);
  ref_forward(out, mean, rstd, inp, w, b, N, C);
  dinp.assign(static_cast<size_t>(N) * C, 0);
  dw.assign(C, 0);
  db.assign(C, 0);
  for (int n = 0; n < N; ++n) {
    double a = 0, bb = 0;
    for (int c = 0; c < C; ++c) {
      const double norm = (inp[n * C + c] - mean[n]) * rstd[n];
      a += w[c] * dout[n * C + c];
      bb += w[c] * dout[n * C + c] * norm;
      dw[c] += norm * dout[n * C + c];
      db[c] += dout[n * C + c];
    }
    a /= C;
    bb /= C;
    for (int c = 0; c < C; ++c) {
      const double norm = (inp[n * C + c] - mean[n]) * rstd[n];
      dinp[n * C + c] = (w[c] * dout[n * C + c] - a - norm * bb) * rstd[n];
    }
  }
}

struct Case {
  int N, C;
  std::vector<float> inp, w, b, dout;
};

Case make_case(int N, int C, uint32_t seed) {
  Case k{N,
         C,
         random_floats(static_cast<size_t>(N) * C, seed, -2.0f, 2.0f),
         random_floats(C, seed + 1, 0.5f, 1.5f),
         random_floats(C, seed + 2, -0.5f, 0.5f),
         random_floats(static_cast<size_t>(N) * C, seed + 3)};
  return k;
}

TEST(KernelLayernorm, ReferenceBackwardMatchesFiniteDifferences) {
  const int N = 3, C = 8;
  const Case k = make_case(N, C, 1);
  const auto inp = to_double(k.inp), w = to_double(k.w), b = to_double(k.b),
             wts = to_double(k.dout);
  auto loss = [&](const std::vector<double>& x, const std::vector<double>& ww,
                  const std::vector<double>& bb) {
    std::vector<double> out, mean, rstd;
    ref_forward(out, mean, rstd, x, ww, bb, N, C);
    return test::weighted_sum(out, wts);
  };
  std::vector<double> dinp, dw, db;
  ref_backward(dinp, dw, db, wts, inp, w, N, C);
  test::expect_gradients_match_finite_differences(dinp, dw, db, inp, w, b, loss);
}

TEST(KernelLayernorm, ForwardAndBackwardMatchReference) {
  for (auto [N, C] : {std::pair{10, 8}, std::pair{37, 200}}) {  // B*T=2*5, C=8; and a ragged one
    const Case k = make_case(N, C, 10 + N);
    std::vector<float> out(k.inp.size()), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), k.inp.data(), k.w.data(), k.b.data(), N,
                      C);
    std::vector<double> rout, rmean, rrstd;
    ref_forward(rout, rmean, rrstd, to_double(k.inp), to_double(k.w), to_double(k.b), N, C);
    expect_close(out, rout, 1e-5, 1e-5, "out");
    expect_close(mean, rmean, 1e-6, 1e-5, "mean");
    expect_close(rstd, rrstd, 0, 1e-5, "rstd");

    // Backward accumulates: start from non-zero gradients and expect them plus the result.
    const auto g0 = random_floats(k.inp.size(), 99), gw0 = random_floats(C, 98),
               gb0 = random_floats(C, 97);
    std::vector<float> dinp = g0, dw = gw0, db = gb0;
    layernorm_backward(dinp.data(), dw.data(), db.data(), k.dout.data(), k.inp.data(), k.w.data(),
                       mean.data(), rstd.data(), N, C);
    std::vector<double> rdinp, rdw, rdb;
    ref_backward(rdinp, rdw, rdb, to_double(k.dout), to_double(k.inp), to_double(k.w), N, C);
    for (size_t i = 0; i < rdinp.size(); ++i) rdinp[i] += g0[i];
    for (int c = 0; c < C; ++c) {
      rdw[c] += gw0[c];
      rdb[c] += gb0[c];
    }
    expect_close(dinp, rdinp, 1e-5, 1e-4, "dinp");
    expect_close(dw, rdw, 1e-5, 1e-4, "dweight");
    expect_close(db, rdb, 1e-5, 1e-4, "dbias");
  }
}

TEST(KernelLayernorm, DeterministicAcrossRunsAndThreadCounts) {
  const int N = 257, C = 130;
  const Case k = make_case(N, C, 5);
  std::vector<float> out(k.inp.size()), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), k.inp.data(), k.w.data(), k.b.data(), N,
                    C);
  auto run = [&](int threads) {
    std::vector<float> dinp(k.inp.size(), 0.5f), dw(C, 0.25f), db(C, -1.0f), o(k.inp.size());
    test::with_threads(threads, [&] {
      layernorm_forward(o.data(), mean.data(), rstd.data(), k.inp.data(), k.w.data(), k.b.data(), N,
                        C);
      layernorm_backward(dinp.data(), dw.data(), db.data(), k.dout.data(), k.inp.data(), k.w.data(),
                         mean.data(), rstd.data(), N, C);
    });
    dinp.insert(dinp.end(), dw.begin(), dw.end());
    dinp.insert(dinp.end(), db.begin(), db.end());
    dinp.insert(dinp.end(), o.begin(), o.end());
    return dinp;
  };
  const auto a = run(2), b = run(2), c = run(1);
  EXPECT_TRUE(test::bit_equal(a, b));
  EXPECT_TRUE(test::bit_equal(a, c));
}

}  // namespace
}  // namespace dsactor::kernels::cpu
