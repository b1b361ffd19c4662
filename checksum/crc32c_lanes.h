#pragma once

// Internal to checksum/: the hardware crc32c's lane layout, shared by the checksum and the
// copies that checksum as they copy.

#include <cstddef>
#include <cstdint>

namespace dsactor::checksum::detail {

// The hardware path runs three crc32 streams over adjacent kCrcLane-byte lanes (the
// instruction's 3-cycle latency, 1-cycle throughput) and merges them.
inline constexpr size_t kCrcLane = 4096;

// The raw (not inverted) crc register after kCrcLane more zero bytes: lane results merge as
// shift(shift(c0) ^ c1) ^ c2, CRC being linear over GF(2).
uint32_t crc32c_shift_lane(uint32_t raw);

}  // namespace dsactor::checksum::detail
