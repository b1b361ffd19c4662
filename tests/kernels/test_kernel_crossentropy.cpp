#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/crossentropy.h"
#include "tests/kernels/kernel_test_util.h"

namespace dsactor::kernels::cpu {
namespace {

using test::random_floats;

constexpr int N = 6, V = 10, Vp = 16;

// Naive log-softmax loss over the first V columns, in double.
std::vector<double> ref_losses(const std::vector<double>& logits, const std::vector<int32_t>& tgt,
                               int n_rows, int v, int vp) {
  std::vector<double> losses(n_rows);
  for (int n = 0; n < n_rows; ++n) {
    double mx = -1e300;
    for (int i = 0; i < v; ++i) mx = std::max(mx, logits[n * vp + i]);
    double sum = 0;
    for (int i = 0; i < v; ++i) sum += std::exp(logits[n * vp + i] - mx);
    losses[n] = std::log(sum) + mx - logits[n * vp + tgt[n]];
  }
  return losses;
}

std::vector<double> ref_dlogits(const std::vector<double>& logits, const std::vector<int32_t>& tgt,
                                int n_rows, int v, int vp, double dloss) {
  std::vector<double> d(logits.size(), 0.0);
  for (int n = 0; n < n_rows; ++n) {
    double mx = -1e300, sum = 0;
    for (int i = 0; i < v; ++i) mx = std::max(mx, logits[n * vp + i]);
    for (int i = 0; i < v; ++i) sum += std::exp(logits[n * vp + i] - mx);
    for (int i = 0; i < v; ++i) {
      d[n * vp + i] = (std::exp(logits[n * vp + i] - mx) / sum - (i == tgt[n] ? 1 : 0)) * dloss;
    }
  }
  return d;
}

std::vector<float> make_logits(uint32_t seed) {
  auto x = random_floats(N * Vp, seed, -4.0f, 4.0f);
  // Padded columns hold garbage that would dominate any softmax they leaked into.
  for (int n = 0; n < N; ++n)
    for (int i = V; i < Vp; ++i) x[n * Vp + i] = 1e30f;
  return x;
}

const std::vector<int32_t> kTargets = {0, 9, 3, 3, 5, 1};

TEST(KernelCrossentropy, ReferenceGradientMatchesFiniteDifferences) {
  const auto logits = test::to_double(make_logits(1));
  const double dloss = 1.0 / N;
  auto loss = [&](const std::vector<double>& x) {
    double s = 0;
    for (double l : ref_losses(x, kTargets, N, V, Vp)) s += l * dloss;
    return s;
  };
  const auto fd = test::finite_diff(logits, loss);
  const auto want = ref_dlogits(logits, kTargets, N, V, Vp, dloss);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < V; ++i) EXPECT_NEAR(want[n * Vp + i], fd[n * Vp + i], 1e-7);
}

TEST(KernelCrossentropy, ForwardIgnoresPaddedColumns) {
  const auto logits = make_logits(2);
  std::vector<float> losses(N);
  crossentropy_forward(losses.data(), logits.data(), kTargets.data(), N, V, Vp);
  test::expect_close(losses, ref_losses(test::to_double(logits), kTargets, N, V, Vp), 1e-6, 1e-6,
                     "losses");
}

TEST(KernelCrossentropy, ForwardBackwardMatchesReferenceAndZeroesPadding) {
  const auto logits = make_logits(3);
  const float dloss = 0.125f;
  std::vector<float> losses(N), dlogits(N * Vp, 42.0f);
  crossentropy_forward_backward(losses.data(), dlogits.data(), logits.data(), kTargets.data(), N, V,
                                Vp, dloss);
  const auto ld = test::to_double(logits);
  test::expect_close(losses, ref_losses(ld, kTargets, N, V, Vp), 1e-6, 1e-6, "losses");
  test::expect_close(dlogits, ref_dlogits(ld, kTargets, N, V, Vp, dloss), 1e-8, 1e-5, "dlogits");
  for (int n = 0; n < N; ++n)
    for (int i = V; i < Vp; ++i) EXPECT_EQ(dlogits[n * Vp + i], 0.0f);

  // In place (dlogits aliases logits) gives the same bits.
  std::vector<float> inplace = logits, losses2(N);
  crossentropy_forward_backward(losses2.data(), inplace.data(), inplace.data(), kTargets.data(), N,
                                V, Vp, dloss);
  EXPECT_TRUE(test::bit_equal(inplace, dlogits));
  EXPECT_TRUE(test::bit_equal(losses2, losses));
}

TEST(KernelCrossentropy, StableForHugeLogits) {
  std::vector<float> logits(Vp, 0.0f);
  for (int i = 0; i < V; ++i) logits[i] = 1000.0f + static_cast<float>(i);  // exp would overflow
  const int32_t target = 9;
  float loss = 0;
  std::vector<float> d(Vp);
  crossentropy_forward_backward(&loss, d.data(), logits.data(), &target, 1, V, Vp, 1.0f);
  double sum = 0;
  for (int i = 0; i < V; ++i) sum += std::exp(i - 9.0);
  EXPECT_NEAR(loss, std::log(sum), 1e-6);
  double dsum = 0;
  for (int i = 0; i < V; ++i) {
    ASSERT_TRUE(std::isfinite(d[i]));
    dsum += d[i];
  }
  EXPECT_NEAR(dsum, 0.0, 1e-6);  // softmax sums to 1, minus the one-hot
}

TEST(KernelCrossentropy, DeterministicAcrossThreadCounts) {
  const int n = 64, v = 5000, vp = 5056;
  const auto logits = random_floats(static_cast<size_t>(n) * vp, 4, -10.0f, 10.0f);
  std::vector<int32_t> tgt(n);
  for (int i = 0; i < n; ++i) tgt[i] = (i * 997) % v;
  auto run = [&](int threads) {
    std::vector<float> losses(n), d(logits.size());
    test::with_threads(threads, [&] {
      crossentropy_forward_backward(losses.data(), d.data(), logits.data(), tgt.data(), n, v, vp,
                                    0.01f);
    });
    d.insert(d.end(), losses.begin(), losses.end());
    return d;
  };
  const auto a = run(2), b = run(2), c = run(1);
  EXPECT_TRUE(test::bit_equal(a, b));
  EXPECT_TRUE(test::bit_equal(a, c));
}

TEST(KernelCrossentropy, SoftmaxRowWithTemperature) {
  const std::vector<float> logits = {1.0f, 2.0f, -3.0f, 0.5f, 1e30f};  // last one is padding
  std::vector<float> probs(4);
  softmax_row(probs.data(), logits.data(), 4, 0.5f);
  double sum = 0;
  for (int i = 0; i < 4; ++i) sum += std::exp(logits[i] / 0.5);
  double total = 0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(probs[i], std::exp(logits[i] / 0.5) / sum, 1e-7) << i;
    total += probs[i];
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
}

}  // namespace
}  // namespace dsactor::kernels::cpu
