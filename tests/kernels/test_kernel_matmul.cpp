#include <gtest/gtest.h>

#include <vector>

#include "kernels/cpu/matmul.h"
#include "tests/kernels/kernel_test_util.h"

namespace dsactor::kernels::cpu {
namespace {

using test::expect_close;
using test::random_floats;
using test::to_double;

// out (N,OC) = inp (N,C) @ w(OC,C)^T + b, in double.
std::vector<double> ref_forward(const std::vector<double>& inp, const std::vector<double>& w,
                                const std::vector<double>* b, int N, int C, int OC) {
  std::vector<double> out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int c = 0; c < C; ++c) s += inp[n * C + c] * w[o * C + c];
      out[n * OC + o] = s;
    }
  return out;
}

void ref_backward(std::vector<double>& dinp, std::vector<double>& dw, std::vector<double>& db,
                  const std::vector<double>& dout, const std::vector<double>& inp,
                  const std::vector<double>& w, int N, int C, int OC) {
  dinp.assign(static_cast<size_t>(N) * C, 0);
  dw.assign(static_cast<size_t>(OC) * C, 0);
  db.assign(OC, 0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const double d = dout[n * OC + o];
      db[o] += d;
      for (int c = 0; c < C; ++c) {
        dinp[n * C + c] += d * w[o * C + c];
        dw[o * C + c] += d * inp[n * C + c];
      }
    }
}

constexpr int N = 10, C = 8, OC = 12;  // N = B*T = 2*5

TEST(KernelMatmul, ReferenceBackwardMatchesFiniteDifferences) {
  const auto inp = to_double(random_floats(N * C, 1)), w = to_double(random_floats(OC * C, 2)),
             b = to_double(random_floats(OC, 3)), wts = to_double(random_floats(N * OC, 4));
  std::vector<double> dinp, dw, db;
  ref_backward(dinp, dw, db, wts, inp, w, N, C, OC);
  auto loss = [&](const std::vector<double>& x, const std::vector<double>& ww,
                  const std::vector<double>& bb) {
    return test::weighted_sum(ref_forward(x, ww, &bb, N, C, OC), wts);
  };
  test::expect_gradients_match_finite_differences(dinp, dw, db, inp, w, b, loss);
}

TEST(KernelMatmul, ForwardMatchesReference) {
  const auto inp = random_floats(N * C, 1), w = random_floats(OC * C, 2), b = random_floats(OC, 3);
  const auto bd = to_double(b);
  std::vector<float> out(N * OC, 123.0f);  // garbage: forward overwrites
  matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
  expect_close(out, ref_forward(to_double(inp), to_double(w), &bd, N, C, OC), 1e-5, 1e-5, "bias");
  std::fill(out.begin(), out.end(), 123.0f);
  matmul_forward(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
  expect_close(out, ref_forward(to_double(inp), to_double(w), nullptr, N, C, OC), 1e-5, 1e-5,
               "no bias");
}

TEST(KernelMatmul, BackwardAccumulatesIntoGradients) {
  const auto inp = random_floats(N * C, 1), w = random_floats(OC * C, 2),
             dout = random_floats(N * OC, 4);
  const auto g_inp = random_floats(N * C, 5), g_w = random_floats(OC * C, 6),
             g_b = random_floats(OC, 7);
  std::vector<float> dinp = g_inp, dw = g_w, db = g_b;
  matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  std::vector<double> rdinp, rdw, rdb;
  ref_backward(rdinp, rdw, rdb, to_double(dout), to_double(inp), to_double(w), N, C, OC);
  for (size_t i = 0; i < rdinp.size(); ++i) rdinp[i] += g_inp[i];
  for (size_t i = 0; i < rdw.size(); ++i) rdw[i] += g_w[i];
  for (size_t i = 0; i < rdb.size(); ++i) rdb[i] += g_b[i];
  expect_close(dinp, rdinp, 1e-5, 1e-5, "dinp");
  expect_close(dw, rdw, 1e-5, 1e-5, "dweight");
  expect_close(db, rdb, 1e-5, 1e-5, "dbias");

  // Null dinp/dbias are skipped; dweight still accumulates.
  std::vector<float> dw2 = g_w;
  matmul_backward(nullptr, dw2.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  expect_close(dw2, rdw, 1e-5, 1e-5, "dweight only");
}

TEST(KernelMatmul, DeterministicAcrossRuns) {
  const int n = 64, c = 96, oc = 200;
  const auto inp = random_floats(n * c, 1), w = random_floats(oc * c, 2),
             dout = random_floats(n * oc, 3), b = random_floats(oc, 4);
  auto run = [&](int threads) {
    std::vector<float> out(n * oc), dinp(n * c, 0.1f), dw(oc * c, 0.2f), db(oc, 0.3f);
    test::with_threads(threads, [&] {
      matmul_forward(out.data(), inp.data(), w.data(), b.data(), n, c, oc);
      matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), n, c,
                      oc);
    });
    for (auto* v : {&dinp, &dw, &db}) out.insert(out.end(), v->begin(), v->end());
    return out;
  };
  const auto a = run(2), b2 = run(2);
  EXPECT_TRUE(test::bit_equal(a, b2));
}

}  // namespace
}  // namespace dsactor::kernels::cpu
