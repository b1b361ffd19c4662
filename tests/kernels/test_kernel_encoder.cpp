#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cpu/encoder.h"
#include "tests/kernels/kernel_test_util.h"

namespace dsactor::kernels::cpu {
namespace {

using test::random_floats;

TEST(KernelEncoder, ForwardAddsTokenAndPositionRows) {
  const int B = 2, T = 5, C = 8, Vp = 16, maxT = 7;
  const std::vector<int32_t> tokens = {3, 1, 3, 15, 0, 2, 2, 2, 9, 3};
  const auto wte = random_floats(Vp * C, 1), wpe = random_floats(maxT * C, 2);
  std::vector<float> out(B * T * C, 99.0f);
  encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        // One float addition: exact agreement expected.
        const float want = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
        ASSERT_EQ(out[(b * T + t) * C + c], want) << b << "," << t << "," << c;
      }
}

TEST(KernelEncoder, BackwardAccumulatesRepeatedTokens) {
  const int B = 2, T = 5, C = 8, Vp = 16, maxT = 7;
  const std::vector<int32_t> tokens = {3, 1, 3, 15, 0, 2, 2, 2, 9, 3};
  const auto dout = random_floats(B * T * C, 3);
  const auto g_wte = random_floats(Vp * C, 4), g_wpe = random_floats(maxT * C, 5);
  std::vector<double> want_wte(g_wte.begin(), g_wte.end()), want_wpe(g_wpe.begin(), g_wpe.end());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        want_wte[tokens[b * T + t] * C + c] += dout[(b * T + t) * C + c];
        want_wpe[t * C + c] += dout[(b * T + t) * C + c];
      }
  std::vector<float> dwte = g_wte, dwpe = g_wpe;
  encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  test::expect_close(dwte, want_wte, 1e-6, 1e-6, "dwte");
  test::expect_close(dwpe, want_wpe, 1e-6, 1e-6, "dwpe");
  // Rows of tokens that never occur, and positions >= T, are untouched.
  for (int c = 0; c < C; ++c) {
    EXPECT_EQ(dwte[4 * C + c], g_wte[4 * C + c]);
    EXPECT_EQ(dwpe[6 * C + c], g_wpe[6 * C + c]);
  }
}

TEST(KernelEncoder, BackwardDeterministicAcrossRunsAndThreadCounts) {
  const int B = 8, T = 64, C = 200, Vp = 32;  // few distinct tokens: many repeats
  std::vector<int32_t> tokens(B * T);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % 5);
  const auto dout = random_floats(B * T * C, 6);
  auto run = [&](int threads) {
    std::vector<float> dwte(Vp * C, 0.0f), dwpe(T * C, 0.0f);
    test::with_threads(threads, [&] {
      encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    });
    dwte.insert(dwte.end(), dwpe.begin(), dwpe.end());
    return dwte;
  };
  const auto a = run(2), b = run(2), c = run(1);
  EXPECT_TRUE(test::bit_equal(a, b));
  EXPECT_TRUE(test::bit_equal(a, c));
}

}  // namespace
}  // namespace dsactor::kernels::cpu
