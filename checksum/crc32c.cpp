#include "checksum/crc32c.h"

#include "checksum/crc32c_lanes.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define DSACTOR_CRC32C_X86 1
#endif

namespace dsactor::checksum {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

using Table = std::array<uint32_t, 256>;

// Slicing-by-8: table k maps a byte that is k positions further from the end of an
// 8-byte word to its contribution, so one word costs 8 lookups instead of 8 dependent steps.
constexpr std::array<Table, 8> make_slicing_tables() {
  std::array<Table, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kPoly : 0u);
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  }
  return t;
}

constexpr std::array<Table, 8> kSlice = make_slicing_tables();

inline uint64_t load_le64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // x86/ARM64 little-endian targets only; memcpy avoids misalignment UB
  return v;
}

// Works on the raw register (no pre/post inversion); callers invert.
uint32_t raw_software(const unsigned char* p, size_t n, uint32_t c) {
  while (n >= 8) {
    const uint64_t w = load_le64(p) ^ c;
    c = kSlice[7][w & 0xFF] ^ kSlice[6][(w >> 8) & 0xFF] ^ kSlice[5][(w >> 16) & 0xFF] ^
        kSlice[4][(w >> 24) & 0xFF] ^ kSlice[3][(w >> 32) & 0xFF] ^ kSlice[2][(w >> 40) & 0xFF] ^
        kSlice[1][(w >> 48) & 0xFF] ^ kSlice[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ kSlice[0][(c ^ *p++) & 0xFF];
  return c;
}

#ifdef DSACTOR_CRC32C_X86

// The hardware crc32 instruction has a 3-cycle latency but 1-cycle throughput, so three
// independent streams over adjacent lanes run ~3x faster than one; the lane results are
// then merged with a "shift by kLane zero bytes" operator (CRC is linear over GF(2)).
constexpr size_t kLane = detail::kCrcLane;  // a power of two: the operator is built by squaring
static_assert((kLane & (kLane - 1)) == 0);

using Matrix = std::array<uint32_t, 32>;  // column i = image of register bit i

constexpr uint32_t apply(const Matrix& m, uint32_t v) {
  uint32_t r = 0;
  for (int i = 0; v != 0; ++i, v >>= 1)
    if (v & 1u) r ^= m[i];
  return r;
}

constexpr Matrix square(const Matrix& m) {
  Matrix r{};
  for (int i = 0; i < 32; ++i) r[i] = apply(m, m[i]);
  return r;
}

// Tables for shift(c) = register after feeding kLane zero bytes starting from c.
constexpr std::array<Table, 4> make_shift_tables() {
  Matrix m{};  // one zero bit
  m[0] = kPoly;
  for (int i = 1; i < 32; ++i) m[i] = 1u << (i - 1);
  for (size_t bits = 1; bits < kLane * 8; bits *= 2) m = square(m);
  std::array<Table, 4> t{};
  for (int k = 0; k < 4; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = apply(m, b << (8 * k));
  return t;
}

constexpr std::array<Table, 4> kShift = make_shift_tables();

inline uint32_t shift_lane(uint32_t c) {
  return kShift[0][c & 0xFF] ^ kShift[1][(c >> 8) & 0xFF] ^ kShift[2][(c >> 16) & 0xFF] ^
         kShift[3][c >> 24];
}

__attribute__((target("sse4.2"))) uint32_t raw_hardware(const unsigned char* p, size_t n,
                                                        uint32_t c) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
  while (n >= 3 * kLane) {
    uint64_t c0 = c, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      c0 = _mm_crc32_u64(c0, load_le64(p + i));
      c1 = _mm_crc32_u64(c1, load_le64(p + kLane + i));
      c2 = _mm_crc32_u64(c2, load_le64(p + 2 * kLane + i));
    }
    c = shift_lane(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c = shift_lane(c) ^ static_cast<uint32_t>(c2);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  uint64_t c64 = c;
  while (n >= 8) {
    c64 = _mm_crc32_u64(c64, load_le64(p));
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool detect_hardware() {
  return __builtin_cpu_supports("sse4.2");
}

#endif

}  // namespace

#ifdef DSACTOR_CRC32C_X86
uint32_t detail::crc32c_shift_lane(uint32_t raw) {
  return shift_lane(raw);
}
#endif

bool crc32c_hardware_available() {
#ifdef DSACTOR_CRC32C_X86
  static const bool available = detect_hardware();
  return available;
#else
  return false;
#endif
}

uint32_t crc32c_software(const void* data, size_t n, uint32_t crc) {
  return ~raw_software(static_cast<const unsigned char*>(data), n, ~crc);
}

uint32_t crc32c_hardware(const void* data, size_t n, uint32_t crc) {
#ifdef DSACTOR_CRC32C_X86
  return ~raw_hardware(static_cast<const unsigned char*>(data), n, ~crc);
#else
  (void)data;
  (void)n;
  (void)crc;
  __builtin_trap();  // documented precondition: only call when hardware is available
#endif
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
#ifdef DSACTOR_CRC32C_X86
  if (crc32c_hardware_available()) return crc32c_hardware(data, n, crc);
#endif
  return crc32c_software(data, n, crc);
}

}  // namespace dsactor::checksum
