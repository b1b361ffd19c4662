#pragma once

#include <cstddef>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

// Times kernels::cpu::adam_step (AdamW, bias correction, weight decay) over n_params
// elements, `iters` timed steps after one warm-up, without and with a bf16 half copy, and in
// the same run a memory-bandwidth probe that streams the same arrays with the same
// per-thread split (4 read, 3 written, +1 half written) doing trivial arithmetic. Traffic
// is counted as 28 bytes/param (+2 with the half copy). Returns params/s and GB/s (1e9
// bytes/s) of each (median over iters, and best), adam/probe ratios (of medians and of
// bests; 1.0 = at the measured bandwidth), plus the ISA path
// and OpenMP thread count used. Throws std::invalid_argument for n_params == 0 or iters < 1.
nlohmann::json run_adam_bench(size_t n_params, int iters);

}  // namespace dsactor::bench
