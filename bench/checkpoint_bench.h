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
  // "offload": ZeRO-3 with parameters and optimizer state on a RAM-tier offload service (a
  // child process), which writes its part of a save while the next step runs; "stage0":
  // the trainer holds everything and writes it before it goes on.
  std::string path = "offload";
};

// Periodic checkpoints' cost as a fraction of step time, in one run: the same training
// (synthetic tokens) on the chosen path for `steps` steps without checkpoints, then `steps`
// more with a save every `every` steps through the CheckpointSeries (engine commit, fsyncs,
// `latest`, keep-last removal), as the trainer's `--checkpoint-every` does. `save_ms` is the
// mean time a save held the trainer (stage 0: the whole save; offload: the request, the
// check at each later step boundary whether the service's part is written, and a wait at
// the end for one that is not); `overhead_fraction` is the measured slowdown;
// `save_overhead_fraction` the mean save time spread over `every` steps of the plain phase,
// which does not depend on how many saves fell into the phase (nor, on the offload path, on
// the service's writing competing with the steps for the cores: overhead_fraction shows
// that). `publish_steps` / `publish_ms`: from a save's begin to its publication. CPU per
// step of the trainer and of the service in each phase, `service_save_cpu_s` what a save
// added to the service's CPU, and the load average at the begin and the end: on a shared
// machine the CPU figures are the steadier ones. `checkpoint_bytes`: the newest save, the
// trainer's part and the service's.
nlohmann::json run_checkpoint_bench(const CheckpointBenchOptions& options);

}  // namespace dsactor::bench
