#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

// Bandwidth of our deterministic allreduce, reduce-scatter and allgather
// (actors::GlooCollectives) beside Gloo's own calls (gloo::allreduce ring,
// ReduceScatterHalvingDoubling, gloo::allgather) on the same buffers and the same
// connections, in the same run. `world_size` ranks run as threads of this process, each
// with its own rendezvous client and TCP mesh on 127.0.0.1. `bytes` is the full buffer
// (allreduce data, reduce-scatter input, allgather output), rounded down to a multiple of
// 4 * world_size. Each measurement does one warm-up call and then `iters` timed ones; the
// time is the slowest rank's. algbw = bytes / time; busbw scales it the nccl-tests way
// (allreduce 2(W-1)/W, reduce-scatter and allgather (W-1)/W) so the numbers compare
// across world sizes. GB/s are 1e9 bytes/s. Ours is called through the blocking API (the
// hop to the communication thread included); Gloo's runs directly on that thread.
// "dsactor_speed_vs_gloo" is Gloo's time over ours per op (above 1: ours is faster).
nlohmann::json run_dp_bench(int world_size = 2, size_t bytes = size_t{64} << 20, int iters = 10);

struct DpStepBenchOptions {
  std::string model = "small";
  int micro_batch = 4;
  int seq = 64;
  int steps = 5;
  int warmup_steps = 1;
};

// Stage-0 training step time with 1 rank and with 2 ranks (each a forked process with one
// OpenMP thread, Gloo over 127.0.0.1, the same micro-batch per rank: the 2-rank run does
// twice the work per step). Reports seconds per step, tokens/s and the scaling efficiency
// tokens/s(2) / (2 * tokens/s(1)): 1.0 is perfect weak scaling, on a machine with at least
// two free cores.
nlohmann::json run_dp_step_bench(const DpStepBenchOptions& options);

}  // namespace dsactor::bench
