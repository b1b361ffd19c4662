#pragma once
// The machine's memory-copy rate, the reference the transfer benches divide by.
#include <cstddef>

namespace dsactor::bench {

// Bytes per second of a warm single-thread memcpy of `bytes` (both sides' pages resident),
// the median of five copies.
double warm_memcpy_bytes_per_second(size_t bytes = size_t{64} << 20);

}  // namespace dsactor::bench
