#pragma once

#include <cstddef>
#include <cstdint>

namespace dsactor::checksum {

// memcpy(dst, src, n) that returns crc32c(src, n, crc), in one pass: each 64 KiB piece is
// checksummed right after it is copied, while it is still in cache, so the copy and the
// checksum read memory once instead of twice. The crc is the source's (the memory the
// caller owns; the destination may be shared with a process that changes it). The ranges
// must not overlap.
uint32_t crc32c_copy(void* dst, const void* src, size_t n, uint32_t crc = 0);

}  // namespace dsactor::checksum
