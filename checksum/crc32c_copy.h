#pragma once

#include <cstddef>
#include <cstdint>

namespace dsactor::checksum {

// memcpy(dst, src, n) that returns crc32c(src, n, crc), in one pass: each 96 KiB piece is
// checksummed right after it is copied, while it is still in cache, so the copy and the
// checksum read memory once instead of twice. The crc is the source's (the memory the
// caller owns; the destination may be shared with a process that changes it). The ranges
// must not overlap. For a destination this thread reads next (it stays in cache).
uint32_t crc32c_copy(void* dst, const void* src, size_t n, uint32_t crc = 0);

// memcpy(dst, src, n) with non-temporal stores, for a destination this thread does not
// read again (another process does, later: a fetch's bytes in the shared arena). A cached
// store first reads each destination line from memory and then evicts useful lines for
// it; a streamed one writes the line without reading it, so a large copy moves two thirds
// of the bytes. Plain memcpy where the CPU has no such stores.
void stream_copy(void* dst, const void* src, size_t n);

// crc32c_copy into such a destination. With SSE4.2 each loaded line is checksummed and
// streamed out from the same registers (three 4 KiB lanes at a time, as the checksum runs
// them): 1.3x the rate of checksumming each piece and then streaming it out of the cache.
uint32_t crc32c_stream_copy(void* dst, const void* src, size_t n, uint32_t crc = 0);

// dst[k] = 0.0f + src[k] for count floats (a -0 becomes +0: the first micro-step's sum as
// the trainer forms it, into a zeroed buffer), streamed out like crc32c_stream_copy, and
// returns crc32c of src's bytes, in the same one pass over src.
uint32_t crc32c_stream_add_zero(float* dst, const float* src, size_t count, uint32_t crc = 0);

}  // namespace dsactor::checksum
