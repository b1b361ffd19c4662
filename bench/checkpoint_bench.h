#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

struct CheckpointBenchOptions {
  std::string model = "gpt2";
  int micro_batch = 4;
  int seq = 64;
  int every = 50;  // steps between checkpoints (the interval the overhead is for)
  int steps = 0;   // measured steps per phase; 0: `every` (one save in the phase)
  int warmup_steps = 1;
  int keep_last = 2;
  std::string dir;  // where the checkpoints go; "": a temporary directory, removed
  uint64_t seed = 1234;
};

// Periodic checkpoints' cost as a fraction of step time, in one run: the same stage-0
// training (synthetic tokens) for `steps` steps without checkpoints, then `steps` more with
// a save every `every` steps through the CheckpointSeries (engine commit, fsyncs, `latest`,
// keep-last removal), as `train --checkpoint-every` does. `overhead_fraction` is the
// measured slowdown; `save_overhead_fraction` the mean save time spread over `every` steps
// of the plain phase, which does not depend on how many saves fell into the phase.
nlohmann::json run_checkpoint_bench(const CheckpointBenchOptions& options);

}  // namespace dsactor::bench
