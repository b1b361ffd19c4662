#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/cast.h"

namespace dsactor::kernels::cpu {
namespace {

// Independent references: pick the nearest representable value by comparing distances in
// double, ties to the even bit pattern. Slow but obviously right.
double fp16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

uint16_t ref_float_to_fp16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0x7e00;  // callers compare NaN-ness only
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return sign | 0x7c00;
  // Largest positive half pattern whose value is <= a (the values are monotonic in bits).
  uint16_t lo = 0, hi = 0x7bff;
  while (lo < hi) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (fp16_value(mid) <= a)
      lo = mid;
    else
      hi = static_cast<uint16_t>(mid - 1);
  }
  if (lo == 0x7bff) return sign | 0x7bff;
  const uint16_t up = lo + 1;
  const double dlo = a - fp16_value(lo), dup = fp16_value(up) - a;
  const uint16_t pick = dlo < dup ? lo : dup < dlo ? up : ((lo & 1) ? up : lo);
  return sign | pick;
}

uint16_t ref_float_to_bf16(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return 0x7fc0;  // callers compare NaN-ness only
  const uint32_t lo = b & 0xffff0000u;
  const double a = std::fabs(static_cast<double>(x));
  const double vlo = std::fabs(static_cast<double>(std::bit_cast<float>(lo)));
  // The pattern above lo; above the largest finite bf16 it is inf, which rounds like 2^128.
  const uint32_t up = lo + 0x10000u;
  const double vup = (up & 0x7fffffffu) == 0x7f800000u
                         ? std::ldexp(1.0, 128)
                         : std::fabs(static_cast<double>(std::bit_cast<float>(up)));
  if (std::isinf(x)) return static_cast<uint16_t>(b >> 16);
  const double dlo = a - vlo, dup = vup - a;
  const uint32_t pick = dlo < dup ? lo : dup < dlo ? up : (((lo >> 16) & 1) ? up : lo);
  return static_cast<uint16_t>(pick >> 16);
}

float from_bits(uint32_t b) {
  return std::bit_cast<float>(b);
}

std::vector<float> interesting_floats() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          -65520.0f,
                          1e10f,
                          INFINITY,
                          -INFINITY,
                          0x1p-24f,
                          0x1p-25f,
                          0x1.8p-24f,
                          0x1p-14f,
                          0x1.ff8p-15f,
                          0x1.ffcp-15f,
                          1.0f + 0x1p-11f,
                          1.0f + 0x1.8p-10f,
                          1.0f + 0x1p-8f,
                          1.0f + 0x1.8p-7f,
                          3.0e38f,
                          from_bits(0x7f7fffff),
                          from_bits(0x00000001),
                          from_bits(0x00012345),
                          from_bits(0x807fffff),
                          0x1p-126f};
  std::mt19937 rng(7);
  // Random bit patterns over all exponents, plus dense sampling of the half range.
  for (int i = 0; i < 200000; ++i) v.push_back(from_bits(rng()));
  std::uniform_real_distribution<float> half_range(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> tiny(-1e-4f, 1e-4f);
  for (int i = 0; i < 100000; ++i) v.push_back(half_range(rng));
  for (int i = 0; i < 100000; ++i) v.push_back(tiny(rng));
  return v;
}

TEST(KernelCast, Fp16EdgeCases) {
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // the midpoint to 65536 rounds to even: inf
  EXPECT_EQ(float_to_fp16(-65520.0f), 0xfc00);
  EXPECT_EQ(float_to_fp16(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f), 0x3c00);    // tie, stays even
  EXPECT_EQ(float_to_fp16(1.0f + 0x1.8p-10f), 0x3c02);  // tie, rounds up to even
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);           // smallest subnormal
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);           // tie between 0 and 1: even
  EXPECT_EQ(float_to_fp16(0x1.8p-24f), 0x0002);         // tie between 1 and 2: even
  EXPECT_EQ(float_to_fp16(0x1.ff8p-15f), 0x03ff);       // largest subnormal
  EXPECT_EQ(float_to_fp16(0x1.ffcp-15f), 0x0400);       // tie rounds up into the normals
  EXPECT_EQ(float_to_fp16(INFINITY), 0x7c00);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(NAN))));
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(from_bits(0x7f800001)))));  // sNaN
  EXPECT_EQ(float_to_fp16(from_bits(0x7fc00000)), 0x7e00);  // NaN keeps its sign
  EXPECT_EQ(float_to_fp16(from_bits(0xffc00000)), 0xfe00);
  EXPECT_EQ(fp16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_float(0xfc00), -INFINITY);
}

TEST(KernelCast, Bf16EdgeCases) {
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);         // tie, stays even
  EXPECT_EQ(float_to_bf16(1.0f + 0x1.8p-7f), 0x3f82);       // tie, rounds up to even
  EXPECT_EQ(float_to_bf16(from_bits(0x7f7fffff)), 0x7f80);  // largest float rounds to inf
  EXPECT_EQ(float_to_bf16(from_bits(0x00000001)), 0x0000);  // subnormal rounds to 0
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000)), 0x0000);  // tie to even 0
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000)), 0x0002);  // tie up to even
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xff80);
  // A NaN whose payload is only in the dropped bits must not become inf.
  const uint16_t snan = float_to_bf16(from_bits(0x7f800001));
  EXPECT_TRUE(std::isnan(bf16_to_float(snan)));
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
}

TEST(KernelCast, Fp16MatchesNearestEvenReference) {
  for (float x : interesting_floats()) {
    const uint16_t got = float_to_fp16(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(got)));
      continue;
    }
    ASSERT_EQ(got, ref_float_to_fp16(x)) << "x=" << x << " bits=" << std::bit_cast<uint32_t>(x);
  }
}

TEST(KernelCast, Bf16MatchesNearestEvenReference) {
  for (float x : interesting_floats()) {
    const uint16_t got = float_to_bf16(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(got)));
      continue;
    }
    ASSERT_EQ(got, ref_float_to_bf16(x)) << "x=" << x << " bits=" << std::bit_cast<uint32_t>(x);
  }
}

TEST(KernelCast, Fp16ToFloatExhaustive) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> arr(65536);
  half_to_floats(arr.data(), all.data(), all.size(), HalfKind::kFP16);  // vectorized path
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(std::bit_cast<uint32_t>(arr[h]), std::bit_cast<uint32_t>(f)) << "h=" << h;
    const bool special = ((h >> 10) & 0x1f) == 0x1f;
    if (!special) {
      ASSERT_EQ(static_cast<double>(f), fp16_value(static_cast<uint16_t>(h))) << "h=" << h;
      // Every finite half survives float -> half unchanged.
      ASSERT_EQ(float_to_fp16(f), h) << "h=" << h;
    } else if ((h & 0x3ff) == 0) {
      ASSERT_TRUE(std::isinf(f));
    } else {
      ASSERT_TRUE(std::isnan(f));
    }
  }
}

TEST(KernelCast, ArrayPathsMatchScalar) {
  // Random bit patterns (NaN payloads included): the F16C/array paths and the scalar
  // functions must agree bit for bit, also on lengths that are not a multiple of 8.
  std::mt19937 rng(11);
  std::vector<float> in(1 << 20 | 5);
  for (auto& x : in) x = from_bits(rng());
  for (HalfKind kind : {HalfKind::kBF16, HalfKind::kFP16}) {
    std::vector<uint16_t> h(in.size());
    floats_to_half(h.data(), in.data(), in.size(), kind);
    std::vector<uint16_t> one(in.size());
    floats_to_half_one_thread(one.data(), in.data(), in.size(), kind);
    ASSERT_EQ(one, h) << "kind=" << static_cast<int>(kind);
    std::vector<float> back(in.size());
    half_to_floats(back.data(), h.data(), h.size(), kind);
    std::vector<float> rt = in;
    round_through_half(rt.data(), rt.size(), kind);
    for (size_t i = 0; i < in.size(); ++i) {
      const uint16_t s = kind == HalfKind::kBF16 ? float_to_bf16(in[i]) : float_to_fp16(in[i]);
      const float f = kind == HalfKind::kBF16 ? bf16_to_float(s) : fp16_to_float(s);
      ASSERT_EQ(h[i], s) << "i=" << i << " kind=" << static_cast<int>(kind);
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(f)) << "i=" << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(rt[i]), std::bit_cast<uint32_t>(f)) << "i=" << i;
    }
  }
}

TEST(KernelCast, RoundThroughHalfFlagsNonFinite) {
  for (size_t n : {size_t{3}, size_t{100003}}) {  // serial and parallel paths
    std::vector<float> x(n, 1000.5f);
    EXPECT_FALSE(round_through_half(x.data(), n, HalfKind::kFP16));
    EXPECT_EQ(x[0], 1000.5f);
    std::vector<float> y(n, 0.1f);
    y[n - 1] = 70000.0f;  // overflows fp16, fine in bf16
    std::vector<float> z = y;
    EXPECT_TRUE(round_through_half(y.data(), n, HalfKind::kFP16));
    EXPECT_TRUE(std::isinf(y[n - 1]));
    EXPECT_EQ(y[0], fp16_to_float(float_to_fp16(0.1f)));
    EXPECT_FALSE(round_through_half(z.data(), n, HalfKind::kBF16));
    EXPECT_EQ(z[n - 1], 70144.0f);  // nearest bf16 to 70000
    std::vector<float> w(n, 2.0f);
    w[n / 2] = NAN;
    EXPECT_TRUE(round_through_half(w.data(), n, HalfKind::kBF16));
  }
}

}  // namespace
}  // namespace dsactor::kernels::cpu
