#include "checksum/crc32c_copy.h"

#include <algorithm>
#include <cstring>

#include "checksum/crc32c.h"

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: in every x86-64 CPU, so no dispatch
#endif

namespace dsactor::checksum {

namespace {

// A multiple of crc32c's three 4 KiB hardware lanes (a piece with a lane left over runs it
// as one slow stream), and small enough to stay in L2 between the copy and the checksum.
constexpr size_t kPiece = size_t{96} << 10;

}  // namespace

uint32_t crc32c_copy(void* dst, const void* src, size_t n, uint32_t crc) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t at = 0; at < n; at += kPiece) {
    const size_t len = std::min(kPiece, n - at);
    std::memcpy(d + at, s + at, len);
    crc = crc32c(s + at, len, crc);
  }
  return crc;
}

void stream_copy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // Streamed stores need a 16-byte aligned destination: the bytes before it are copied
  // plainly, as is a tail shorter than one 64-byte line.
  const size_t head = std::min(n, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  auto* out = reinterpret_cast<__m128i*>(d);
  const auto* in = reinterpret_cast<const __m128i*>(s);
  const size_t lines = n / 64;
  for (size_t i = 0; i < lines; ++i, in += 4, out += 4) {
    const __m128i a = _mm_loadu_si128(in), b = _mm_loadu_si128(in + 1), c = _mm_loadu_si128(in + 2),
                  e = _mm_loadu_si128(in + 3);
    _mm_stream_si128(out, a);
    _mm_stream_si128(out + 1, b);
    _mm_stream_si128(out + 2, c);
    _mm_stream_si128(out + 3, e);
  }
  std::memcpy(d + lines * 64, s + lines * 64, n - lines * 64);
  // Streamed stores are weakly ordered: fenced before anything (the reply saying the bytes
  // are there) can be seen after them.
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

uint32_t crc32c_stream_copy(void* dst, const void* src, size_t n, uint32_t crc) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t at = 0; at < n; at += kPiece) {
    const size_t len = std::min(kPiece, n - at);
    crc = crc32c(s + at, len, crc);
    stream_copy(d + at, s + at, len);
  }
  return crc;
}

}  // namespace dsactor::checksum
