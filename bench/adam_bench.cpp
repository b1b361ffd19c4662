#include "bench/adam_bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/adam.h"

namespace dsactor::bench {

namespace {

using kernels::cpu::AdamHyper;
using kernels::cpu::HalfCopy;
using kernels::cpu::HalfKind;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

template <typename T>
std::unique_ptr<T[], FreeDeleter> alloc_aligned(size_t n) {
  const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) {
    throw std::runtime_error("adam bench: cannot allocate " + std::to_string(bytes) + " bytes");
  }
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(p));
}

// The same split adam_step uses: one contiguous, 64-element aligned piece per thread, so the
// probe touches each page from the same thread as the kernel does.
template <typename F>
void per_thread_chunks(size_t n, F&& f) {
#pragma omp parallel
  {
    const size_t nt = static_cast<size_t>(omp_get_num_threads());
    const size_t id = static_cast<size_t>(omp_get_thread_num());
    const size_t per = ((n + nt - 1) / nt + 63) / 64 * 64;
    const size_t lo = std::min(n, id * per);
    const size_t hi = std::min(n, lo + per);
    if (lo < hi) f(lo, hi);
  }
}

// Reads param, m, v, grad and writes param, m, v (and a half copy): Adam's traffic with
// next to no arithmetic.
void stream_probe(float* p, float* m, float* v, const float* g, uint16_t* half, size_t n) {
  per_thread_chunks(n, [&](size_t lo, size_t hi) {
    if (half == nullptr) {
#pragma omp simd
      for (size_t i = lo; i < hi; ++i) {
        const float s = g[i];
        p[i] += s;
        m[i] += s;
        v[i] += s;
      }
    } else {
#pragma omp simd
      for (size_t i = lo; i < hi; ++i) {
        const float s = g[i];
        p[i] += s;
        m[i] += s;
        v[i] += s;
        half[i] = 0x3f80;  // bf16 1.0: a 2-byte store, no conversion work
      }
    }
  });
}

struct Timing {
  double median_s;
  double best_s;
};

template <typename F>
Timing time_iters(int iters, F&& f) {
  f();  // warm-up: page faults, caches, OpenMP thread start
  std::vector<double> t(static_cast<size_t>(iters));
  for (double& s : t) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

nlohmann::json rates(const Timing& t, size_t n, double bytes_per_param) {
  const double nd = static_cast<double>(n);
  return {{"seconds_per_iter_median", t.median_s},
          {"seconds_per_iter_best", t.best_s},
          {"params_per_s", nd / t.median_s},
          {"gb_per_s", nd * bytes_per_param / t.median_s / 1e9},
          {"gb_per_s_best", nd * bytes_per_param / t.best_s / 1e9},
          {"bytes_per_param", bytes_per_param}};
}

}  // namespace

nlohmann::json run_adam_bench(size_t n_params, int iters) {
  if (n_params == 0) throw std::invalid_argument("adam bench: n_params must be > 0");
  if (iters < 1) throw std::invalid_argument("adam bench: iters must be >= 1");
  const size_t n = n_params;
  auto p = alloc_aligned<float>(n), m = alloc_aligned<float>(n), v = alloc_aligned<float>(n),
       g = alloc_aligned<float>(n);
  auto half = alloc_aligned<uint16_t>(n);
  // First touch with the kernel's split.
  per_thread_chunks(n, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) {
      p[i] = 0.01f * static_cast<float>(i % 97) - 0.5f;
      m[i] = 0.0f;
      v[i] = 0.0f;
      g[i] = 1e-3f * static_cast<float>(i % 89) - 0.04f;
      half[i] = 0;
    }
  });

  AdamHyper h;
  h.lr = 1e-4f;
  h.weight_decay = 0.01f;
  h.adamw_mode = true;
  h.bias_correction = true;
  int64_t step = 0;
  const Timing adam = time_iters(iters, [&] {
    kernels::cpu::adam_step(p.get(), m.get(), v.get(), g.get(), n, h, ++step, 1.0f);
  });
  const Timing adam_half = time_iters(iters, [&] {
    kernels::cpu::adam_step(p.get(), m.get(), v.get(), g.get(), n, h, ++step, 1.0f,
                            HalfCopy{half.get(), HalfKind::kBF16});
  });
  // The sum of squares every pushed gradient costs the service (and the trainer's norm):
  // against the Adam pass over the same parameters, and on the scalar path beside the best.
  const Timing stats = time_iters(iters, [&] { (void)kernels::cpu::grad_stats(g.get(), n); });
  const Timing stats_scalar =
      time_iters(iters, [&] { (void)kernels::cpu::grad_stats_isa("scalar", g.get(), n); });
  const Timing probe =
      time_iters(iters, [&] { stream_probe(p.get(), m.get(), v.get(), g.get(), nullptr, n); });
  const Timing probe_half =
      time_iters(iters, [&] { stream_probe(p.get(), m.get(), v.get(), g.get(), half.get(), n); });

  nlohmann::json out;
  out["n_params"] = n;
  out["iters"] = iters;
  out["threads"] = omp_get_max_threads();
  out["isa"] = kernels::cpu::adam_isa();
  out["adam"] = rates(adam, n, 28.0);
  out["adam_half_bf16"] = rates(adam_half, n, 30.0);
  out["stream_probe"] = rates(probe, n, 28.0);
  out["stream_probe_half"] = rates(probe_half, n, 30.0);
  out["grad_stats"] = rates(stats, n, 4.0);
  out["grad_stats_scalar"] = rates(stats_scalar, n, 4.0);
  out["grad_stats_time_over_adam"] = stats.median_s / adam.median_s;
  out["ratio_to_probe"] = probe.median_s / adam.median_s;
  out["ratio_to_probe_half"] = probe_half.median_s / adam_half.median_s;
  // Best-of-iters ratios: less sensitive to other load on a shared machine.
  out["ratio_to_probe_best"] = probe.best_s / adam.best_s;
  out["ratio_to_probe_half_best"] = probe_half.best_s / adam_half.best_s;
  return out;
}

}  // namespace dsactor::bench
