#pragma once
// A pushed gradient added into a RAM partition's fp32 sum in one pass over memory: the
// payload widened, added, its sum of squares and (optionally) its crc32c all computed on
// one cache-sized piece at a time, instead of one pass each over the whole partition.

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/grad_stats_stream.h"
#include "messages/codec.h"

namespace dsactor::offload {

struct AccumulatedPush {
  kernels::cpu::GradStats stats;  // of the sum, bit-identical to kernels::cpu::grad_stats
  uint32_t crc32c = 0;            // of the payload's bytes, when asked for
};

// sum = (first ? 0 : sum) + widen(payload) over n elements, element by element, the
// trainer's order of additions into a zeroed buffer (0 + -0 is +0), so sums stay
// bit-identical. The payload holds n elements of `dtype`. With `stream` (a push in ranges,
// each range one call) the squares go into it and the result's stats stay empty.
AccumulatedPush accumulate_push(float* sum, std::span<const std::byte> payload,
                                messages::DType dtype, uint64_t n, bool first, bool with_crc,
                                kernels::cpu::GradStatsStream* stream = nullptr);

// A gradient kept where the push left it (PushGradients.keepUntilCommit): its stats, read
// where it lies in 96 KiB pieces like accumulate_push's, and whether any element is -0.
// Adam over the kept bytes equals Adam over accumulate_push's sum (0 + g) exactly when none
// is: 0 + -0 is +0, every other value adds to itself.
struct KeptGradientStats {
  kernels::cpu::GradStats stats;  // bit-identical to accumulate_push's for these bytes
  bool negative_zero = false;
};
KeptGradientStats kept_gradient_stats(const float* g, uint64_t n);

}  // namespace dsactor::offload
