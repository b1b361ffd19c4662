#include "checksum/crc32c.h"
#include "checksum/crc32c_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace dsactor::checksum {
namespace {

struct Vector {
  std::string data;
  uint32_t crc;
};

// Known answers: the standard check value, and vectors from RFC 3720 (iSCSI) appendix B.4.
std::vector<Vector> known_vectors() {
  std::vector<Vector> v;
  v.push_back({"123456789", 0xE3069283u});
  v.push_back({"", 0x00000000u});
  v.push_back({"a", 0xC1D04330u});
  v.push_back({std::string(32, '\0'), 0x8A9136AAu});
  v.push_back({std::string(32, '\xff'), 0x62A8AB43u});
  std::string inc(32, '\0'), dec(32, '\0');
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<char>(i);
    dec[i] = static_cast<char>(31 - i);
  }
  v.push_back({inc, 0x46DD794Eu});
  v.push_back({dec, 0x113FDB5Cu});
  return v;
}

TEST(Crc32c, SoftwareKnownVectors) {
  for (const auto& kv : known_vectors())
    EXPECT_EQ(crc32c_software(kv.data.data(), kv.data.size()), kv.crc) << "len " << kv.data.size();
}

TEST(Crc32c, HardwareKnownVectors) {
  if (!crc32c_hardware_available()) GTEST_SKIP() << "CPU lacks SSE4.2";
  for (const auto& kv : known_vectors())
    EXPECT_EQ(crc32c_hardware(kv.data.data(), kv.data.size()), kv.crc) << "len " << kv.data.size();
}

TEST(Crc32c, DispatchedKnownVector) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
}

// Sizes straddle the 3-lane threshold (3 * 4096) and misaligned starts exercise the
// alignment prologue, so the lane-merging arithmetic is checked against the simple path.
TEST(Crc32c, HardwareMatchesSoftwareAcrossSizesAndAlignments) {
  if (!crc32c_hardware_available()) GTEST_SKIP() << "CPU lacks SSE4.2";
  std::mt19937_64 rng(42);
  std::vector<unsigned char> buf(3 * 4096 * 3 + 64);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t n :
       {0u, 1u, 7u, 8u, 9u, 63u, 4095u, 12287u, 12288u, 12289u, 24576u, 30000u, 36864u}) {
    for (size_t off : {0u, 1u, 3u, 7u}) {
      ASSERT_EQ(crc32c_hardware(buf.data() + off, n), crc32c_software(buf.data() + off, n))
          << "n=" << n << " off=" << off;
    }
  }
}

TEST(Crc32c, Extendable) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> buf(50000);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const uint32_t whole = crc32c(buf.data(), buf.size());
  for (size_t cut : {0u, 1u, 13u, 12288u, 20000u, 49999u, 50000u}) {
    const uint32_t a = crc32c(buf.data(), cut);
    EXPECT_EQ(crc32c(buf.data() + cut, buf.size() - cut, a), whole) << "cut=" << cut;
    const uint32_t sa = crc32c_software(buf.data(), cut);
    EXPECT_EQ(crc32c_software(buf.data() + cut, buf.size() - cut, sa), whole) << "cut=" << cut;
  }
}

TEST(Crc32c, DetectsSingleBitFlip) {
  std::vector<unsigned char> buf(40000, 0x5A);
  const uint32_t before = crc32c(buf.data(), buf.size());
  buf[31337] ^= 0x10;
  EXPECT_NE(crc32c(buf.data(), buf.size()), before);
}

TEST(Crc32c, CopyEqualsMemcpyThenCrc) {
  // Lengths around the 96 KiB pieces and the 4 KiB hardware lanes, odd offsets included.
  std::mt19937 rng(7);
  std::vector<unsigned char> src((size_t{3} << 16) + 77);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  // And around the three 4 KiB lanes the SSE4.2 copy checksums at once.
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{4095}, size_t{12287}, size_t{12288}, size_t{12289},
        size_t{24576} + 100, size_t{65536}, size_t{65537}, size_t{3} << 16, src.size() - 3}) {
    std::vector<unsigned char> dst(n + 3, 0xAB);
    const uint32_t seed = n % 2 ? 0x1234u : 0u;
    const uint32_t crc = crc32c_copy(dst.data() + 1, src.data() + 3, n, seed);
    EXPECT_EQ(crc, crc32c_software(src.data() + 3, n, seed)) << "n " << n;
    EXPECT_TRUE(
        std::equal(dst.begin() + 1, dst.begin() + 1 + static_cast<ptrdiff_t>(n), src.begin() + 3))
        << "n " << n;
    EXPECT_EQ(dst[0], 0xAB);
    EXPECT_EQ(dst[n + 1], 0xAB) << "n " << n;
  }
}

TEST(Crc32c, StreamCopiesEqualMemcpy) {
  // Lengths around the 96 KiB pieces, the 64-byte lines and the 16-byte store alignment,
  // at every destination misalignment the streamed stores must step over.
  std::mt19937 rng(11);
  std::vector<unsigned char> src((size_t{3} << 16) + 777);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  for (size_t offset : {size_t{0}, size_t{1}, size_t{7}, size_t{15}}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{63}, size_t{64}, size_t{65},
                     size_t{4097}, size_t{12288}, size_t{12288} + 15, size_t{36864} + 63,
                     size_t{96} << 10, (size_t{96} << 10) + 1, src.size() - 5}) {
      const uint32_t seed = n % 2 ? 0x5678u : 0u;
      for (const bool with_crc : {false, true}) {
        std::vector<unsigned char> dst(n + 32, 0xCD);
        unsigned char* at = dst.data() + offset;
        if (with_crc) {
          EXPECT_EQ(crc32c_stream_copy(at, src.data() + 5, n, seed),
                    crc32c_software(src.data() + 5, n, seed))
              << "n " << n << " offset " << offset;
        } else {
          stream_copy(at, src.data() + 5, n);
        }
        EXPECT_TRUE(std::equal(at, at + n, src.begin() + 5)) << "n " << n << " offset " << offset;
        EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + static_cast<ptrdiff_t>(offset),
                                [](unsigned char b) { return b == 0xCD; }));
        EXPECT_TRUE(std::all_of(dst.begin() + static_cast<ptrdiff_t>(offset + n), dst.end(),
                                [](unsigned char b) { return b == 0xCD; }))
            << "n " << n << " offset " << offset;
      }
    }
  }
}

// The first micro-step's streamed 0 + g: every float as the scalar 0.0f + g gives it (a -0
// turns +0, NaN stays NaN), the crc of the source's bytes, at lengths around the three 4 KiB
// lanes and the 16-byte store alignment, from every float-aligned destination offset.
TEST(Crc32c, StreamAddZeroIsZeroPlusEachFloat) {
  std::mt19937 rng(13);
  std::vector<float> src((size_t{3} << 14) + 777);
  for (auto& f : src) f = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
  for (size_t k = 0; k < src.size(); k += 97) src[k] = -0.0f;
  src[5] = -0.0f;
  src[6] = std::numeric_limits<float>::quiet_NaN();
  for (size_t offset : {size_t{0}, size_t{1}, size_t{2}, size_t{3}}) {
    for (size_t count :
         {size_t{0}, size_t{1}, size_t{3}, size_t{16}, size_t{17}, size_t{3072}, size_t{3072} + 3,
          size_t{6144} + 15, size_t{24576}, size_t{24577}, src.size() - 5}) {
      const uint32_t seed = count % 2 ? 0x1234u : 0u;
      std::vector<float> dst(count + 8, 7.0f);
      float* at = dst.data() + offset;
      EXPECT_EQ(crc32c_stream_add_zero(at, src.data() + 5, count, seed),
                crc32c_software(src.data() + 5, count * sizeof(float), seed))
          << "count " << count << " offset " << offset;
      bool same = true;
      for (size_t k = 0; k < count; ++k) {
        const float want = 0.0f + src[5 + k];
        same &= std::memcmp(&at[k], &want, sizeof(float)) == 0;
      }
      EXPECT_TRUE(same) << "count " << count << " offset " << offset;
      if (count > 0) {
        EXPECT_FALSE(std::signbit(at[0])) << "a -0 stays -0";
      }
      for (size_t k = 0; k < offset; ++k) EXPECT_EQ(dst[k], 7.0f);
      for (size_t k = offset + count; k < dst.size(); ++k) EXPECT_EQ(dst[k], 7.0f);
    }
  }
}

}  // namespace
}  // namespace dsactor::checksum
