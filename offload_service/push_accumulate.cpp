#include "offload_service/push_accumulate.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "checksum/crc32c.h"
#include "checksum/crc32c_copy.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/grad_stats_stream.h"
#include "offload_service/store_common.h"

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: in every x86-64 CPU, so no dispatch
#endif

namespace dsactor::offload {

namespace {

// sum[k] = 0.0f + g[k] (the trainer's first micro-step: a -0 turns +0) with non-temporal
// stores: this pass never reads the sum again (the commit's Adam pass does, long after it
// left the cache), so its lines are written without first being read from memory.
void stream_first_micro_step(float* sum, const float* g, uint64_t n) {
  uint64_t k = 0;
#if defined(__x86_64__)
  if (reinterpret_cast<uintptr_t>(sum) % 16 == 0) {
    const __m128 zero = _mm_setzero_ps();
    for (; k + 16 <= n; k += 16) {
      for (uint64_t j = 0; j < 16; j += 4)
        _mm_stream_ps(sum + k + j, _mm_add_ps(zero, _mm_loadu_ps(g + k + j)));
    }
    // Streamed stores are weakly ordered: fenced before the reply can be seen after them.
    _mm_sfence();
  }
#endif
  for (; k < n; ++k) sum[k] = 0.0f + g[k];
}

}  // namespace

KeptGradientStats kept_gradient_stats(const float* g, uint64_t n) {
  constexpr uint64_t kPiece = 24576;  // accumulate_push's: the check reads the piece in cache
  kernels::cpu::GradStatsStream stream;
  KeptGradientStats out;
  for (uint64_t i = 0; i < n; i += kPiece) {
    const uint64_t c = std::min(kPiece, n - i);
    stream.add(g + i, c);
    out.negative_zero = out.negative_zero || kernels::cpu::has_negative_zero(g + i, c);
  }
  out.stats = stream.finish();
  return out;
}

AccumulatedPush accumulate_push(float* sum, std::span<const std::byte> payload,
                                messages::DType dtype, uint64_t n, bool first, bool with_crc,
                                kernels::cpu::GradStatsStream* stream) {
  // 96 KiB of fp32: the widened piece, the payload's bytes and the sum's piece stay in L2
  // from the crc to the sum of squares. A multiple of grad_stats' 4096-element blocks, so
  // the stream never carries a partial block between pieces, and of crc32c's three 4 KiB
  // lanes, so no piece ends in a lane checksummed as one slow stream.
  constexpr uint64_t kPiece = 24576;
  const size_t element = messages::dtype_size(dtype);
  // One micro-step of fp32 (the usual case): the payload goes straight into the sum, checked
  // as it is copied, and becomes the trainer's 0 + g (a -0 turns +0) while still in cache.
  // When its bytes are aligned for floats (an arena slice) the piece is checksummed and its
  // squares summed where it lies (the squares of g and of 0 + g are the same bits), then
  // streamed into the sum as 0 + g.
  const bool fp32 = dtype == messages::DType::fp32;
  const bool copy_only = first && fp32;
  const bool float_aligned = reinterpret_cast<uintptr_t>(payload.data()) % alignof(float) == 0;
  // Later micro-steps of fp32 add the payload's floats where they lie, with no copy into a
  // piece between, when the bytes are aligned for floats (a frame or an arena slice need
  // not be: those still go through the piece).
  const bool add_in_place = !first && fp32 && float_aligned;
  std::vector<float> widened(copy_only || add_in_place ? 0
                                                       : static_cast<size_t>(std::min(kPiece, n)));
  kernels::cpu::GradStatsStream own;
  kernels::cpu::GradStatsStream& stats = stream ? *stream : own;
  AccumulatedPush out;
  for (uint64_t i = 0; i < n; i += kPiece) {
    const uint64_t c = std::min(kPiece, n - i);
    if (copy_only && float_aligned) {
      const auto* g = reinterpret_cast<const float*>(payload.data() + i * element);
      // The checksum rides on the streamed 0 + g (one pass from memory: a 64 MiB push took
      // 0.69-0.73x the time of checksumming each piece and then streaming it, same run); the
      // squares are then summed from the piece in cache.
      if (with_crc) {
        out.crc32c = checksum::crc32c_stream_add_zero(sum + i, g, c, out.crc32c);
      } else {
        stream_first_micro_step(sum + i, g, c);
      }
      stats.add(g, c);
      continue;
    }
    if (copy_only) {
      float* s = sum + i;
      const std::byte* src = payload.data() + i * element;
      if (with_crc) {
        out.crc32c = checksum::crc32c_copy(s, src, c * element, out.crc32c);
      } else {
        std::memcpy(s, src, c * element);
      }
      for (uint64_t k = 0; k < c; ++k) s[k] = 0.0f + s[k];
      stats.add(s, c);
      continue;
    }
    if (with_crc)
      out.crc32c = checksum::crc32c(payload.data() + i * element, c * element, out.crc32c);
    float* s = sum + i;
    if (add_in_place) {
      const auto* g = reinterpret_cast<const float*>(payload.data()) + i;
      for (uint64_t k = 0; k < c; ++k) s[k] += g[k];
      stats.add(s, c);
      continue;
    }
    detail::payload_to_floats(widened.data(), payload, dtype, i, c);
    if (first) {
      for (uint64_t k = 0; k < c; ++k) s[k] = 0.0f + widened[k];
    } else {
      for (uint64_t k = 0; k < c; ++k) s[k] += widened[k];
    }
    stats.add(s, c);
  }
  if (!stream) out.stats = stats.finish();
  return out;
}

}  // namespace dsactor::offload
