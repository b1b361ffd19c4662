#include "messages/payload_crc.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#define DSACTOR_MESSAGES_CRC_X86 1
#endif

namespace dsactor::messages {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kPoly : 0u);
    t[b] = c;
  }
  return t;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

// Raw register update, no pre/post inversion.
uint32_t raw_software(const unsigned char* p, size_t n, uint32_t c) {
  while (n--) c = (c >> 8) ^ kTable[(c ^ *p++) & 0xFFu];
  return c;
}

#ifdef DSACTOR_MESSAGES_CRC_X86
// One stream of the crc32 instruction: ~8 bytes/cycle-ish, plenty for checking a frame
// that just crossed a socket. storage/crc32c has the 3-stream version for NVMe.
__attribute__((target("sse4.2"))) uint32_t raw_hardware(const unsigned char* p, size_t n,
                                                        uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // frames need not be 8-byte aligned
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool have_sse42() {
  return __builtin_cpu_supports("sse4.2");
}
#endif

}  // namespace

uint32_t payload_crc32c_software(const void* data, size_t n, uint32_t crc) {
  return ~raw_software(static_cast<const unsigned char*>(data), n, ~crc);
}

uint32_t payload_crc32c(const void* data, size_t n, uint32_t crc) {
#ifdef DSACTOR_MESSAGES_CRC_X86
  if (have_sse42()) return ~raw_hardware(static_cast<const unsigned char*>(data), n, ~crc);
#endif
  return payload_crc32c_software(data, n, crc);
}

}  // namespace dsactor::messages
