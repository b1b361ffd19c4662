#include "checksum/crc32c_copy.h"

#include <algorithm>
#include <cstring>

#include "checksum/crc32c.h"
#include "checksum/crc32c_lanes.h"

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: in every x86-64 CPU, so no dispatch
#include <nmmintrin.h>  // SSE4.2's crc32: dispatched on crc32c_hardware_available()
#endif

namespace dsactor::checksum {

namespace {

// A multiple of crc32c's three 4 KiB hardware lanes (a piece with a lane left over runs it
// as one slow stream), and small enough to stay in L2 between the copy and the checksum.
constexpr size_t kPiece = size_t{96} << 10;

#if defined(__x86_64__)
constexpr size_t kLane = detail::kCrcLane;

// The bytes from d to the first 16-byte aligned address (at most n): streamed stores need
// that alignment, so those go plainly.
size_t to_stream_alignment(const void* d, size_t n) {
  return std::min(n, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
}

// One 64-byte line of a lane: its eight words into the lane's crc, its four 16-byte
// pieces streamed out from the same registers, each as 0.0f + its four floats when
// kAddZero (the checksum is of the bytes loaded, before the add).
template <bool kAddZero>
__attribute__((target("sse4.2"), always_inline)) inline uint64_t line(unsigned char* d,
                                                                      const unsigned char* s,
                                                                      uint64_t c) {
  const auto* in = reinterpret_cast<const __m128i*>(s);
  auto* out = reinterpret_cast<__m128i*>(d);
  for (int k = 0; k < 4; ++k) {
    __m128i v = _mm_loadu_si128(in + k);
    c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_cvtsi128_si64(v)));
    c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v))));
    if constexpr (kAddZero) v = _mm_castps_si128(_mm_add_ps(_mm_setzero_ps(), _mm_castsi128_ps(v)));
    _mm_stream_si128(out + k, v);
  }
  return c;
}

// The streamed copy and the checksum in one pass over the source: three lanes of kLane
// bytes at a time, a line of each in turn, so the three crc32 chains interleave as the
// checksum's own hardware path runs them. Moves d, s and n past the whole blocks of
// 3 * kLane bytes it did; returns the raw register. d must be 16-byte aligned.
template <bool kAddZero>
__attribute__((target("sse4.2"))) uint32_t stream_lanes(unsigned char*& d, const unsigned char*& s,
                                                        size_t& n, uint32_t raw) {
  while (n >= 3 * kLane) {
    uint64_t c0 = raw, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kLane; i += 64) {
      c0 = line<kAddZero>(d + i, s + i, c0);
      c1 = line<kAddZero>(d + kLane + i, s + kLane + i, c1);
      c2 = line<kAddZero>(d + 2 * kLane + i, s + 2 * kLane + i, c2);
    }
    raw = detail::crc32c_shift_lane(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    raw = detail::crc32c_shift_lane(raw) ^ static_cast<uint32_t>(c2);
    d += 3 * kLane;
    s += 3 * kLane;
    n -= 3 * kLane;
  }
  return raw;
}
#endif

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
  // A tail shorter than one 64-byte line is copied plainly too.
  const size_t head = to_stream_alignment(d, n);
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
#if defined(__x86_64__)
  if (crc32c_hardware_available()) {
    const size_t head = to_stream_alignment(d, n);
    std::memcpy(d, s, head);
    crc = crc32c(s, head, crc);
    d += head;
    s += head;
    n -= head;
    crc = ~stream_lanes<false>(d, s, n, ~crc);
    _mm_sfence();  // streamed stores are weakly ordered (see stream_copy)
    crc = crc32c(s, n, crc);
    stream_copy(d, s, n);  // the last bytes short of three lanes
    return crc;
  }
#endif
  for (size_t at = 0; at < n; at += kPiece) {
    const size_t len = std::min(kPiece, n - at);
    crc = crc32c(s + at, len, crc);
    stream_copy(d + at, s + at, len);
  }
  return crc;
}

uint32_t crc32c_stream_add_zero(float* dst, const float* src, size_t count, uint32_t crc) {
  size_t done = 0;
#if defined(__x86_64__)
  if (crc32c_hardware_available()) {
    // A float* is 4-byte aligned, so the head to 16 bytes is whole floats.
    const size_t head = to_stream_alignment(dst, count * sizeof(float)) / sizeof(float);
    crc = crc32c(src, head * sizeof(float), crc);
    for (size_t k = 0; k < head; ++k) dst[k] = 0.0f + src[k];
    auto* d = reinterpret_cast<unsigned char*>(dst + head);
    const auto* s = reinterpret_cast<const unsigned char*>(src + head);
    size_t n = (count - head) * sizeof(float);
    crc = ~stream_lanes<true>(d, s, n, ~crc);
    _mm_sfence();  // streamed stores are weakly ordered (see stream_copy)
    done = count - n / sizeof(float);
  }
#endif
  // The rest (short of three lanes, or every element without SSE4.2): checksummed, then
  // added, a piece at a time while it is in cache.
  for (size_t at = done; at < count; at += kPiece / sizeof(float)) {
    const size_t c = std::min(kPiece / sizeof(float), count - at);
    crc = crc32c(src + at, c * sizeof(float), crc);
    for (size_t k = at; k < at + c; ++k) dst[k] = 0.0f + src[k];
  }
  return crc;
}

}  // namespace dsactor::checksum
