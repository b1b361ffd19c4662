#pragma once

#include <cstddef>
#include <cstdint>

namespace dsactor::checksum {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum every partition,
// wire payload and checkpoint tensor carries. Extendable: crc32c(b, nb, crc32c(a, na))
// equals the CRC of a followed by b, so large buffers can be checksummed in pieces.
// Uses the SSE4.2 crc32 instruction when the CPU has it, a table otherwise; both give
// identical results.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// The portable path alone, exposed so tests can check both paths against each other.
uint32_t crc32c_software(const void* data, size_t n, uint32_t crc = 0);

// The SSE4.2 path alone; only valid when crc32c_hardware_available() is true.
uint32_t crc32c_hardware(const void* data, size_t n, uint32_t crc = 0);
bool crc32c_hardware_available();

}  // namespace dsactor::checksum
