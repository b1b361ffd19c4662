#pragma once

#include <cstddef>

namespace dsactor::messages {

// ZeroMQ mallocs a fresh buffer for every message it receives. glibc serves buffers above
// its mmap threshold with new pages, and starts that threshold at 128 KiB, moving it as
// the process frees mapped blocks; it also returns the top of its heap to the kernel once
// more than its trim threshold is free. Either way a received 8 MiB frame can land on
// pages the kernel has to fault in one by one while the bytes arrive, and on the
// paravirtualized machines we measure on that costs more than the copy itself: a push in
// 8 MiB ranges ran at 0.7 or at 2-3 GB/s from run to run, at 0.83-0.94 of raw ZeroMQ with
// the thresholds fixed (bench/README, session 18).
//
// Pinning both thresholds keeps frames up to `kFrameHeapMmapThreshold` on heap pages that
// stay resident between steps, as long as no more than `kFrameHeapTrimThreshold` of them
// sits free at the heap's top. Frames larger than that (a whole fetch reply of the
// embedding) are still mapped and unmapped per message; those travel in ranges instead.
inline constexpr std::size_t kFrameHeapMmapThreshold = std::size_t{32} << 20;  // glibc's max
inline constexpr std::size_t kFrameHeapTrimThreshold = std::size_t{128} << 20;

// Fixes glibc's mmap and trim thresholds for the whole process (mallopt), where it receives
// large frames: the offload service at its start, a trainer once any of its services goes
// over frames, `bench transport`. Not everywhere: a trainer on the same host moves its
// payloads through the arena, and the heap kept resident would only raise its peak RSS
// (0.238 -> 0.263 of stage 0 in `bench zero`, over the 0.25 goal). Safe to call at any time
// and more than once; returns false where the allocator refused (not glibc, or a value out
// of its range).
bool keep_received_frames_on_the_heap();

}  // namespace dsactor::messages
