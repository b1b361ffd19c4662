#pragma once

#include <cstddef>
#include <cstdint>

namespace dsactor::messages {

// CRC-32C (Castagnoli) of a payload frame, same convention as storage/crc32c.h (initial
// value 0, extendable: crc(b, crc(a)) == crc(a ++ b)), so a crc stored next to a partition
// on NVMe can be sent on the wire unchanged. Duplicated here because messages/ may depend
// on nothing of ours; to be unified once a lowest shared layer exists.
uint32_t payload_crc32c(const void* data, size_t n, uint32_t crc = 0);

// The table path alone, so tests can check the SSE4.2 path against it.
uint32_t payload_crc32c_software(const void* data, size_t n, uint32_t crc = 0);

}  // namespace dsactor::messages
