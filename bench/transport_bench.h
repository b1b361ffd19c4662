#pragma once

#include <cstddef>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

// Push and fetch GB/s (1e9 bytes/s) of one `partition_bytes` fp32 partition over tcp://
// loopback through the real service path (an in-process OffloadService: gateway, codec
// with crc32c, store actor, gradient accumulation + grad_stats for pushes, zero-copy
// fetch replies; an OffloadClient on the other end), against a raw ZeroMQ DEALER/ROUTER
// transfer of the same bytes in the same run (zero-copy frames, a small ack per
// transfer). Each path runs plain and with CurveZMQ (the service with its ZAP handler and
// an authorized client key; raw ZeroMQ with the same keys), payloads as frames and through
// the same-host shared-memory arena (where only the control messages are encrypted).
// Every figure is also given as a ratio to raw plain ZeroMQ of the same run. Each side
// does one warm-up transfer first, then `iterations` timed ones. `push_range_bytes`: the
// range a micro-step-0 frames push goes in (OffloadClient::set_push_range_bytes; 0: whole),
// and raw ZeroMQ's `push_ranges_gbps` sends the same ranges. `fetch_part_bytes`: the parts a
// frames fetch reply comes in (OffloadClient::set_fetch_part_bytes; 0: one frame), and raw
// ZeroMQ's `fetch_parts_gbps` answers in the same parts.
nlohmann::json run_transport_bench(size_t partition_bytes, int iterations, size_t push_range_bytes,
                                   size_t fetch_part_bytes);

}  // namespace dsactor::bench
