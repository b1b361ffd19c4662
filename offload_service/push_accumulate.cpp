#include "offload_service/push_accumulate.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "checksum/crc32c.h"
#include "checksum/crc32c_copy.h"
#include "kernels/cpu/grad_stats_stream.h"
#include "offload_service/store_common.h"

namespace dsactor::offload {

AccumulatedPush accumulate_push(float* sum, std::span<const std::byte> payload,
                                messages::DType dtype, uint64_t n, bool first, bool with_crc) {
  // 96 KiB of fp32: the widened piece, the payload's bytes and the sum's piece stay in L2
  // from the crc to the sum of squares. A multiple of grad_stats' 4096-element blocks, so
  // the stream never carries a partial block between pieces, and of crc32c's three 4 KiB
  // lanes, so no piece ends in a lane checksummed as one slow stream.
  constexpr uint64_t kPiece = 24576;
  const size_t element = messages::dtype_size(dtype);
  // One micro-step of fp32 (the usual case): the payload goes straight into the sum, checked
  // as it is copied, and becomes the trainer's 0 + g (a -0 turns +0) while still in cache.
  const bool fp32 = dtype == messages::DType::fp32;
  const bool copy_only = first && fp32;
  // Later micro-steps of fp32 add the payload's floats where they lie, with no copy into a
  // piece between, when the bytes are aligned for floats (a frame or an arena slice need
  // not be: those still go through the piece).
  const bool add_in_place =
      !first && fp32 && reinterpret_cast<uintptr_t>(payload.data()) % alignof(float) == 0;
  std::vector<float> widened(copy_only || add_in_place ? 0
                                                       : static_cast<size_t>(std::min(kPiece, n)));
  kernels::cpu::GradStatsStream stats;
  AccumulatedPush out;
  for (uint64_t i = 0; i < n; i += kPiece) {
    const uint64_t c = std::min(kPiece, n - i);
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
  out.stats = stats.finish();
  return out;
}

}  // namespace dsactor::offload
