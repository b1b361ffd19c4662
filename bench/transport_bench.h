#pragma once

#include <cstddef>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

// Push and fetch GB/s (1e9 bytes/s) of one `partition_bytes` fp32 partition over tcp://
// loopback through the real service path (an in-process OffloadService: gateway, codec
// with crc32c, store actor, gradient accumulation + grad_stats for pushes, zero-copy
// fetch replies; an OffloadClient on the other end), against a raw ZeroMQ DEALER/ROUTER
// transfer of the same bytes in the same run (zero-copy frames, a small ack per
// transfer). Returns both, and service/raw ratios. Each side does one warm-up transfer
// first, then `iterations` timed ones.
nlohmann::json run_transport_bench(size_t partition_bytes = size_t{64} << 20, int iterations = 10);

}  // namespace dsactor::bench
