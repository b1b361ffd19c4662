#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

struct ZeroMemoryBenchOptions {
  std::string model = "small";
  int micro_batch = 2;
  int seq = 64;
  int steps = 2;
  std::vector<int> world_sizes = {1, 2, 4};
};

// What one rank holds with ZeRO stages 1-3 without offload (the ranks hold the partitions)
// at each world size, against stage 0: per rank the optimizer state (fp32 master, m, v),
// the parameters the forward reads (stages 1/2 every block, stage 3 its resident set at its
// peak), the gradients at their peak and the reduced partitions kept for the optimizer,
// from the engines' own counters (Engine::memory, ZeroStats), and the rank's peak RSS
// (VmHWM; each rank a forked process, one OpenMP thread, Gloo over 127.0.0.1). Ratios are
// the largest rank's over stage 0's; the goal for the partitioned state is 1/W.
nlohmann::json run_zero_memory_bench(const ZeroMemoryBenchOptions& options);
// That result as a table: a line per stage and world size, bytes with their ratio to
// stage 0 beside them.
std::string zero_memory_table(const nlohmann::json& result);

}  // namespace dsactor::bench
