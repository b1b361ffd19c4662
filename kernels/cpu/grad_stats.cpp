// Sum of squares of a gradient, for global-norm clipping and the overflow vote: the trainer
// and the offload service both take it, on every pushed partition, so it runs at memory
// speed (32 independent sums) and returns the same bits on every vector path.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/detail.h"
#include "kernels/cpu/grad_stats_stream.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/threads.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace dsactor::kernels::cpu {

namespace {

constexpr size_t kStatsBlock = detail::kGradStatsBlock;
constexpr size_t kLanes = 32;
constexpr size_t kParallelMin = size_t{1} << 15;

// One block's sum: element i adds its square to lane i % 32, in element order, and the lanes
// fold in halves (lane j += lane j + w for w = 16, 8, 4, 2, 1). A float's square is exact in
// a double (at most 48 significant bits), so the lanes' additions are the only roundings, and
// any vector width (each vector element is one or more whole lanes), with or without fused
// multiply-adds, gives these bits. One sum would wait on its own add for every element.
// Inlined into each target's function below, which sets its vector width.
[[gnu::always_inline]] inline double block_lanes(const float* g, size_t n) {
  double lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const double x = static_cast<double>(g[i + j]);
      lane[j] += x * x;
    }
  }
  for (size_t j = 0; i + j < n; ++j) {
    const double x = static_cast<double>(g[i + j]);
    lane[j] += x * x;
  }
  for (size_t w = kLanes / 2; w > 0; w /= 2) {
    for (size_t j = 0; j < w; ++j) lane[j] += lane[j + w];
  }
  return lane[0];
}

double block_scalar(const float* g, size_t n) {
  return block_lanes(g, n);
}
[[gnu::target("avx2")]] double block_avx2(const float* g, size_t n) {
  return block_lanes(g, n);
}
[[gnu::target("avx512f")]] double block_avx512(const float* g, size_t n) {
  return block_lanes(g, n);
}

using BlockFn = double (*)(const float*, size_t);

BlockFn block_fn(detail::Isa isa) {
  if (isa == detail::Isa::kAvx512) return &block_avx512;
  if (isa == detail::Isa::kAvx2) return &block_avx2;
  return &block_scalar;
}

BlockFn best_block_fn() {
  static const BlockFn fn = block_fn(detail::detect_isa());
  return fn;
}

GradStats grad_stats_with(BlockFn block, const float* grad, size_t n,
                          const detail::AfterStatsBlock* after = nullptr) {
  // Fixed-size blocks, each summed in its fixed order, then added in block order: the same
  // result for any thread count. A square of a finite float cannot overflow a double, so
  // the total is non-finite exactly when an element is inf/NaN.
  const size_t nblocks = (n + kStatsBlock - 1) / kStatsBlock;
  std::vector<double> partial(nblocks, 0.0);
  const auto nb = static_cast<int64_t>(nblocks);
  adopt_threads();
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < nb; ++b) {
    const size_t lo = static_cast<size_t>(b) * kStatsBlock;
    const size_t len = std::min(n, lo + kStatsBlock) - lo;
    partial[static_cast<size_t>(b)] = block(grad + lo, len);
    if (after) (*after)(lo, len);
  }
  GradStats st;
  for (double s : partial) st.sum_squares += s;
  st.nonfinite = !std::isfinite(st.sum_squares);
  return st;
}

}  // namespace

GradStats detail::grad_stats_then(const float* grad, size_t n, const AfterStatsBlock& after) {
  return grad_stats_with(best_block_fn(), grad, n, &after);
}

bool has_negative_zero(const float* grad, size_t n) {
  // Compared as bits (-0 == +0 as floats), 16 at a time with SSE2 (every x86-64 CPU has
  // it), so the check runs at the speed of the loads.
  size_t k = 0;
  bool found = false;
#if defined(__x86_64__)
  const __m128i sign = _mm_set1_epi32(static_cast<int>(0x80000000u));
  __m128i seen = _mm_setzero_si128();
  for (; k + 16 <= n; k += 16) {
    for (size_t j = 0; j < 16; j += 4) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(grad + k + j));
      seen = _mm_or_si128(seen, _mm_cmpeq_epi32(v, sign));
    }
  }
  found = _mm_movemask_epi8(seen) != 0;
#endif
  for (; k < n && !found; ++k) found = std::bit_cast<uint32_t>(grad[k]) == 0x80000000u;
  return found;
}

GradStatsAndSigns grad_stats_and_negative_zero(const float* grad, size_t n) {
  // Per block, so the threads share no flag; read after the blocks' parallel loop.
  std::vector<char> negative_zero((n + kStatsBlock - 1) / kStatsBlock, 0);
  GradStatsAndSigns out;
  const detail::AfterStatsBlock check = [&](size_t lo, size_t len) {
    negative_zero[lo / kStatsBlock] = has_negative_zero(grad + lo, len) ? 1 : 0;
  };
  out.stats = grad_stats_with(best_block_fn(), grad, n, &check);
  out.negative_zero =
      std::find(negative_zero.begin(), negative_zero.end(), 1) != negative_zero.end();
  return out;
}

GradStats grad_stats(const float* grad, size_t n) {
  return grad_stats_with(best_block_fn(), grad, n);
}

GradStats grad_stats_isa(const char* isa, const float* grad, size_t n) {
  return grad_stats_with(block_fn(detail::isa_named(isa, "grad_stats_isa")), grad, n);
}

void GradStatsStream::add(const float* grad, size_t n) {
  const BlockFn block = best_block_fn();
  if (!carry_.empty()) {
    const size_t take = std::min(n, kStatsBlock - carry_.size());
    carry_.insert(carry_.end(), grad, grad + take);
    grad += take;
    n -= take;
    if (carry_.size() < kStatsBlock) return;
    sum_squares_ += block(carry_.data(), kStatsBlock);
    carry_.clear();
  }
  for (; n >= kStatsBlock; grad += kStatsBlock, n -= kStatsBlock) {
    sum_squares_ += block(grad, kStatsBlock);
  }
  carry_.assign(grad, grad + n);
}

GradStats GradStatsStream::finish() {
  if (!carry_.empty()) sum_squares_ += best_block_fn()(carry_.data(), carry_.size());
  carry_.clear();
  GradStats st{sum_squares_, !std::isfinite(sum_squares_)};
  sum_squares_ = 0.0;
  return st;
}

}  // namespace dsactor::kernels::cpu
