#include "checksum/crc32c_copy.h"

#include <algorithm>
#include <cstring>

#include "checksum/crc32c.h"

namespace dsactor::checksum {

uint32_t crc32c_copy(void* dst, const void* src, size_t n, uint32_t crc) {
  // A multiple of crc32c's 4 KiB hardware lanes, and small enough to stay in L2 between the
  // copy and the checksum.
  constexpr size_t kPiece = size_t{64} << 10;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t at = 0; at < n; at += kPiece) {
    const size_t len = std::min(kPiece, n - at);
    std::memcpy(d + at, s + at, len);
    crc = crc32c(s + at, len, crc);
  }
  return crc;
}

}  // namespace dsactor::checksum
