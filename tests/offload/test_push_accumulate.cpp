// accumulate_push (offload_service/push_accumulate.h), the one-pass push into a RAM
// partition's gradient sum, against the straightforward passes it replaces: widen, add,
// grad_stats over the whole sum, crc32c over the whole payload.

#include "offload_service/push_accumulate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "checksum/crc32c.h"
#include "kernels/cpu/cast.h"

namespace dsactor::offload {
namespace {

namespace kc = dsactor::kernels::cpu;
using messages::DType;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The payload's bytes, starting one byte into the buffer when `odd` (a frame's payload need
// not be aligned).
std::vector<std::byte> payload_of(const std::vector<float>& g, DType dtype, bool odd) {
  const size_t element = messages::dtype_size(dtype);
  std::vector<std::byte> out(g.size() * element + 1);
  std::byte* at = out.data() + (odd ? 1 : 0);
  if (dtype == DType::fp32) {
    std::memcpy(at, g.data(), g.size() * 4);
  } else {
    std::vector<uint16_t> half(g.size());
    kc::floats_to_half(half.data(), g.data(), g.size(),
                       dtype == DType::bf16 ? kc::HalfKind::kBF16 : kc::HalfKind::kFP16);
    std::memcpy(at, half.data(), g.size() * 2);
  }
  return out;
}

float widen(const std::byte* p, DType dtype) {
  if (dtype == DType::fp32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == DType::bf16 ? kc::bf16_to_float(h) : kc::fp16_to_float(h);
}

TEST(PushAccumulate, EqualsWidenAddStatsAndCrcPassByPass) {
  // Sizes around the 16384-element pieces and grad_stats' 4096-element blocks.
  for (size_t n : {size_t{1}, size_t{4095}, size_t{16384}, size_t{16385}, size_t{70001}}) {
    for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
      for (bool odd : {false, true}) {
        const auto earlier = random_floats(n, 1);
        const auto g = random_floats(n, 2);
        const auto bytes = payload_of(g, dtype, odd);
        const std::span<const std::byte> payload(bytes.data() + (odd ? 1 : 0),
                                                 n * messages::dtype_size(dtype));
        for (bool first : {true, false}) {
          std::vector<float> want = earlier, got = earlier;
          for (size_t i = 0; i < n; ++i) {
            const float x = widen(payload.data() + i * messages::dtype_size(dtype), dtype);
            want[i] = first ? 0.0f + x : want[i] + x;
          }
          const AccumulatedPush r = accumulate_push(got.data(), payload, dtype, n, first, true);
          const std::string what = "n " + std::to_string(n) + " dtype " +
                                   std::to_string(static_cast<int>(dtype)) +
                                   (first ? " first" : " later") + (odd ? " odd" : "");
          EXPECT_EQ(std::memcmp(want.data(), got.data(), n * 4), 0) << what;
          const kc::GradStats stats = kc::grad_stats(want.data(), n);
          EXPECT_EQ(r.stats.sum_squares, stats.sum_squares) << what;
          EXPECT_EQ(r.stats.nonfinite, stats.nonfinite) << what;
          EXPECT_EQ(r.crc32c, checksum::crc32c(payload.data(), payload.size())) << what;
        }
      }
    }
  }
}

TEST(PushAccumulate, FirstMicroStepTurnsNegativeZeroPositiveAndFlagsNonFinite) {
  std::vector<float> g(5000, -0.0f);
  g[4321] = std::numeric_limits<float>::infinity();
  const auto bytes = payload_of(g, DType::fp32, false);
  std::vector<float> sum(g.size(), 7.0f);
  const AccumulatedPush r =
      accumulate_push(sum.data(), std::span<const std::byte>(bytes.data(), g.size() * 4),
                      DType::fp32, g.size(), true, false);
  EXPECT_FALSE(std::signbit(sum[0]));  // 0 + -0 is +0, as the trainer's zeroed buffer gives
  EXPECT_TRUE(std::isinf(sum[4321]));
  EXPECT_TRUE(r.stats.nonfinite);
  EXPECT_EQ(r.crc32c, 0u);  // not asked for
}

// The first fp32 micro-step streams 0 + g into the sum; a sum that starts off a 16-byte
// boundary (and a count that is not a multiple of the stores' width) gets the same bits.
TEST(PushAccumulate, FirstMicroStepIntoASumOfAnyAlignment) {
  for (size_t shift : {size_t{0}, size_t{1}, size_t{3}}) {
    for (size_t n : {size_t{15}, size_t{24576}, size_t{50001}}) {
      auto g = random_floats(n, 3);
      g[n / 2] = -0.0f;
      const auto bytes = payload_of(g, DType::fp32, false);
      std::vector<float> buffer(n + shift, 9.0f), want(n);
      for (size_t i = 0; i < n; ++i) want[i] = 0.0f + g[i];
      const AccumulatedPush r =
          accumulate_push(buffer.data() + shift, std::span<const std::byte>(bytes.data(), n * 4),
                          DType::fp32, n, true, true);
      const std::string what = "shift " + std::to_string(shift) + " n " + std::to_string(n);
      EXPECT_EQ(std::memcmp(want.data(), buffer.data() + shift, n * 4), 0) << what;
      EXPECT_FALSE(std::signbit(buffer[shift + n / 2])) << what;
      EXPECT_EQ(r.stats.sum_squares, kc::grad_stats(want.data(), n).sum_squares) << what;
      EXPECT_EQ(r.crc32c, checksum::crc32c(bytes.data(), n * 4)) << what;
    }
  }
}

}  // namespace
}  // namespace dsactor::offload
