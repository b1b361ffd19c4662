#include "offload_service/nvme_partition.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/grad_stats_stream.h"
#include "offload_service/store_common.h"

namespace dsactor::offload {

namespace msg = dsactor::messages;
namespace kc = dsactor::kernels::cpu;
using detail::refuse;
using msg::ErrorCode;

kc::GradStats nvme_accumulate(NvmeIo& io, WorkerPartition& p, std::span<const std::byte> payload,
                              msg::DType dtype) {
  const bool first = p.micro_steps == 0;
  const std::string id = "partition " + std::to_string(p.spec.partition_id);
  if (first) {
    if (p.next) drop_gradient(io, p);
    try {
      p.next = NvmeLocation{io.reserve(p.n()), 0, std::nullopt};
    } catch (const std::exception& e) {
      refuse(ErrorCode::internal,
             id + ": no room on the NVMe tier for the step's gradient: " + e.what());
    }
  }
  kc::GradStatsStream stats;
  constexpr uint64_t kBlock = 16384;
  std::vector<float> tmp(kBlock);
  const std::optional<uint32_t> sum = first ? std::nullopt : std::optional(p.next->crc32c);
  try {
    p.next->crc32c =
        io.accumulate(p.next->extent, p.n(), sum, [&](uint64_t at, uint64_t count, float* acc) {
          for (uint64_t i = 0; i < count; i += kBlock) {
            const uint64_t c = std::min(kBlock, count - i);
            detail::payload_to_floats(tmp.data(), payload, dtype, at + i, c);
            float* a = acc + i;
            // The RAM tier's order of additions (0 + -0 is +0), so sums stay bit-identical.
            if (first) {
              for (uint64_t k = 0; k < c; ++k) a[k] = 0.0f + tmp[k];
            } else {
              for (uint64_t k = 0; k < c; ++k) a[k] += tmp[k];
            }
          }
          stats.add(acc, count);
        });
  } catch (const ChecksumError& e) {
    drop_gradient(io, p);
    refuse(ErrorCode::checksumMismatch,
           id + ": the step's gradient on NVMe: " + e.what() + "; its gradient was dropped");
  } catch (const std::exception& e) {
    const bool had = !first;
    drop_gradient(io, p);
    refuse(ErrorCode::internal,
           id + ": accumulating on NVMe failed: " + e.what() +
               (had ? "; the step's gradient was dropped (push it again from micro-step 0)" : ""));
  }
  p.micro_steps++;
  return stats.finish();
}

void nvme_serve(NvmeIo& io, const WorkerPartition& p, msg::DType dtype, std::byte* out) {
  try {
    io.read_master(*p.loc, p.n(), [&](const NvmeTier::Chunk& c) {
      if (dtype == msg::DType::fp32) {
        std::memcpy(out + c.first * 4, c.master, c.count * 4);
      } else {
        kc::floats_to_half(reinterpret_cast<uint16_t*>(out) + c.first, c.master, c.count,
                           detail::half_kind(dtype));
      }
    });
  } catch (const ChecksumError& e) {
    refuse(ErrorCode::checksumMismatch,
           "partition " + std::to_string(p.spec.partition_id) + ": " + e.what());
  }
}

NvmeLocation nvme_adam(NvmeIo& io, const WorkerPartition& p, const kc::AdamHyper& hyper,
                       int64_t adam_t, float multiplier) {
  return io.rewrite_with(*p.loc, *p.next, p.n(), [&](const NvmeTier::Chunk& k) {
    kc::adam_step(k.master, k.m, k.v, k.grad, k.count, hyper, adam_t, multiplier);
  });
}

void drop_gradient(NvmeIo& io, WorkerPartition& p) {
  if (p.next) io.release(p.next->extent);
  p.next.reset();
  p.micro_steps = 0;
}

}  // namespace dsactor::offload
