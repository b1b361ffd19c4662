#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

struct ZeroBenchOptions {
  std::string model = "gpt2";
  int micro_batch = 4;
  // gradient_accumulation_steps: micro-steps a step (the trainer accumulates them and pushes
  // each partition once a step).
  int micro_steps = 1;
  // The run's precision, for both runs: fp32, or bf16 / fp16 (the ds_config's section enabled
  // with DeepSpeed's defaults), whose gradients go to the service in the half type.
  std::string precision = "fp32";
  int seq = 64;
  int warmup_steps = 1;
  int steps = 2;
  uint64_t seed = 1234;
  // Stage-3 knobs in elements (ds_config's units). The prefetch-on phase uses
  // prefetch_bucket; the prefetch-off phase uses 0, which ParamScheduler reads as "no
  // prefetch". prefetch_bucket 0: one transformer layer ahead (the scheduler still
  // prefetches a larger block, the embedding, when nothing else is in flight), which hides
  // a fetch behind a layer's compute; DeepSpeed's 5e7 would hold five gpt2 layers ahead.
  // max_live 0: the largest block plus two layers, the least that lets the embedding be
  // prefetched while a layer runs, rather than DeepSpeed's 1e9 (which holds all of gpt2).
  int64_t prefetch_bucket = 0;
  int64_t max_live = 0;
  // DeepSpeed's default: a released block stays while the live bound has room for it,
  // which keeps the tied embedding from the lookup to the LM head and the last layers
  // across the forward-to-backward turn. 0: every use of a block fetches it.
  int64_t reuse_distance = 1000000000;
  // stage3_param_persistence_threshold; unset: DeepSpeed's default (1e5 elements), under
  // which every block of the tiny test model stays resident after its first fetch.
  std::optional<int64_t> persistence_threshold;
  int timeout_seconds = 120;  // per service request
  // Payloads through the same-host shared-memory arena (ZeroOptions::shared_memory);
  // false: frames over loopback tcp, as before the arena existed.
  bool shared_memory = true;
  // Stage-3 fetches map the service's master read-only (ZeroOptions::master_views).
  bool master_views = true;
  // How they use the views (ZeroOptions::master_view_use): "map", "read", or "auto" (the
  // engine measures which this host does cheaper).
  std::string master_view_use = "auto";
  // Arena pushes over a request channel (ZeroOptions::request_channel).
  bool request_channel = false;
  // ZeroOptions::pushes_sent_together: in-place pushes sent to the service as one group;
  // unset: the engine's default.
  std::optional<size_t> pushes_together;
  // zero_optimization.offload_optimizer.arena_checksums: arena payloads carry a crc32c
  // their receiver checks (off by default, as in the ds_config).
  bool arena_checksums = false;
  // zero_optimization.offload_optimizer.update_at_push: the service runs each partition's
  // Adam step on its push, in the backward, instead of at the commit.
  bool update_at_push = false;
  // Stage 0 and stage 3 (prefetch on) run this many times, alternating, after the first
  // pair of the usual phases; the step-time and CPU ratios are then also given pair by
  // pair and as their median. On a shared box whose speed drifts between phases, a pair
  // measured back to back is steadier than one stage-0 phase against later ones.
  int pairs = 1;
  // One more stage-3 phase (prefetch on), last, with the service on a core of its own and
  // the trainer on the others (core_split.h): the service's CPU per step without sharing
  // its core with the trainer's compute. Needs at least 2 CPUs.
  bool service_own_core = false;
};

// The stage-3 resident set the ZeRO benches run with by default: prefetch one transformer
// layer ahead, hold at most the largest block plus two layers (ds_config's elements).
struct Stage3Knobs {
  int64_t prefetch_bucket = 0;
  int64_t max_live = 0;
};
Stage3Knobs lean_stage3_knobs(const std::string& model);

// Stage 0 (trainer::Engine) against stage 3 with offload_optimizer and offload_param on
// cpu through a real `dsactor start --role offload` child process, prefetch on and off, in
// one invocation. Each phase runs in a forked child of the bench so that its VmHWM (the
// trainer's peak RSS, which cannot be reset) is its own. Reports step-time ratios, peak
// RSS ratios, the engines' own accounting of resident bytes, bytes pushed/fetched per step
// against the model size, and the fraction of fetch time hidden behind compute.
nlohmann::json run_zero_bench(const ZeroBenchOptions& options);

// Ratios of interleaved (stage 0, stage 3) phase pairs: each pair's step-time and CPU
// ratio (`each`), and the medians over the pairs.
nlohmann::json paired_ratios(
    const std::vector<std::pair<nlohmann::json, nlohmann::json>>& stage0_stage3);

}  // namespace dsactor::bench
