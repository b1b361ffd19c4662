#include "bench/zero_memory_bench.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <stdexcept>

#include "bench/forked_child.h"
#include "bench/rank_world.h"
#include "bench/zero_bench.h"
#include "trainer/data/batch_loader.h"
#include "trainer/engine/engine.h"
#include "trainer/zero/zero_engine.h"

namespace dsactor::bench {

namespace {

constexpr const char* kCounters[] = {"optimizer_state_bytes", "param_bytes", "grad_bytes",
                                     "kept_grad_bytes", "vm_hwm_bytes"};

// One rank of one phase, in its own process: `steps` steps, then what it holds.
nlohmann::json memory_rank(const ZeroMemoryBenchOptions& o, int stage, int rank, int world_size,
                           const RankMeeting& meeting) {
  omp_set_num_threads(1);
  const trainer::GptConfig gpt = trainer::resolve_model(o.model);
  if (o.seq > gpt.block_size)
    throw std::invalid_argument("zero memory bench: --seq exceeds the model's block_size");
  nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", o.micro_batch},
                        {"gradient_accumulation_steps", 1},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
                        {"zero_optimization", {{"stage", stage}}}};
  if (stage == 3) {
    // DeepSpeed's defaults would keep every block of a small model resident.
    const Stage3Knobs lean = lean_stage3_knobs(o.model);
    cfg["zero_optimization"].update({{"stage3_prefetch_bucket_size", lean.prefetch_bucket},
                                     {"stage3_max_live_parameters", lean.max_live},
                                     {"stage3_max_reuse_distance", 0}});
  }
  const trainer::DsConfig config = trainer::parse_ds_config(cfg, "zero memory bench", world_size);
  const auto tokens = synthetic_tokens(
      static_cast<size_t>(o.micro_batch) * o.seq * world_size * 8 + 1, gpt.vocab_size);
  trainer::BatchLoader loader(&tokens, o.micro_batch, o.seq, false, 1, rank, world_size);
  RankWorld world = join_rank_world(rank, world_size, meeting, "zero-memory-bench", stage == 3);
  nlohmann::json j;
  if (stage == 0) {
    trainer::Engine e(gpt, config, 1234, world.grad.get());
    for (int i = 0; i < o.steps; ++i) e.train_step(loader);
    const auto m = e.memory();
    j = {{"optimizer_state_bytes", m.optimizer_state_bytes},
         {"param_bytes", m.param_bytes},
         {"grad_bytes", m.grad_bytes},
         {"kept_grad_bytes", m.grad_bytes}};
  } else {
    trainer::ZeroOptions zo;
    zo.rank = static_cast<uint32_t>(rank);
    zo.world_size = static_cast<uint32_t>(world_size);
    zo.grad_comm = world.grad.get();
    zo.param_comm = world.param.get();
    trainer::ZeroEngine e(gpt, config, 1234, zo);
    for (int i = 0; i < o.steps; ++i) e.train_step(loader);
    const auto s = e.stats();
    j = {{"optimizer_state_bytes", s.optimizer_state_bytes},
         {"param_bytes", s.peak_resident_param_bytes},
         {"grad_bytes", s.peak_resident_grad_bytes},
         {"kept_grad_bytes", s.kept_grad_bytes}};
  }
  j["vm_hwm_bytes"] = proc_status_bytes("VmHWM");
  return j;
}

// The largest rank's value of each counter.
nlohmann::json largest_rank(const std::vector<nlohmann::json>& ranks) {
  nlohmann::json out;
  for (const char* c : kCounters) {
    size_t most = 0;
    for (const auto& r : ranks) most = std::max(most, r.at(c).get<size_t>());
    out[c] = most;
  }
  return out;
}

nlohmann::json run_phase(const ZeroMemoryBenchOptions& o, int stage, int world_size) {
  const auto ranks =
      run_forked_ranks("zero memory bench stage " + std::to_string(stage), world_size,
                       [&o, stage, world_size](int rank, const RankMeeting& meeting) {
                         return memory_rank(o, stage, rank, world_size, meeting);
                       });
  return largest_rank(ranks);
}

}  // namespace

nlohmann::json run_zero_memory_bench(const ZeroMemoryBenchOptions& o) {
  if (o.steps < 1 || o.micro_batch < 1 || o.seq < 1)
    throw std::invalid_argument("zero memory bench: steps, micro-batch and seq must be >= 1");
  // Stage 0 holds the same per rank at any world size: one reference phase.
  const nlohmann::json stage0 = run_phase(o, 0, 1);
  nlohmann::json stages;
  for (int stage : {1, 2, 3})
    for (int w : o.world_sizes) {
      nlohmann::json p = run_phase(o, stage, w);
      for (const char* c : kCounters)
        p[std::string(c) + "_ratio"] = p[c].get<double>() / std::max(1.0, stage0[c].get<double>());
      p["goal_ratio"] = 1.0 / w;
      stages[std::to_string(stage)][std::to_string(w)] = std::move(p);
    }
  return {{"model", o.model},
          {"micro_batch_per_rank", o.micro_batch},
          {"seq", o.seq},
          {"steps", o.steps},
          {"stage0", stage0},
          {"stages", stages},
          {"note",
           "per rank, the largest rank's; ranks hold the partitions (no offload); param_bytes: "
           "stage 0 and 1/2 every block, stage 3 the resident set's peak; grad_bytes: the "
           "gradients' peak, kept_grad_bytes: the reduced partitions kept for the optimizer; "
           "vm_hwm_bytes includes the process's libraries and activations"}};
}

std::string zero_memory_table(const nlohmann::json& r) {
  auto cell = [](const nlohmann::json& p, const char* c) {
    const double mib = p.at(c).get<double>() / (1 << 20);
    const std::string ratio = std::string(c) + "_ratio";
    return p.contains(ratio) ? fmt::format("{:9.2f} ({:.3f})", mib, p.at(ratio).get<double>())
                             : fmt::format("{:9.2f}        ", mib);
  };
  std::string out = fmt::format(
      "ZeRO without offload, model {}, micro-batch {} x {} per rank: per rank (the largest), "
      "MiB (ratio to stage 0; the goal for the partitioned state is 1/W)\n",
      r.at("model").get<std::string>(), r.at("micro_batch_per_rank").get<int>(),
      r.at("seq").get<int>());
  out += fmt::format("{:>5} {:>2}  {:>17}  {:>17}  {:>17}  {:>17}  {:>17}\n", "stage", "W",
                     "optimizer state", "params", "grads (peak)", "grads kept", "peak RSS");
  auto line = [&](const std::string& stage, const std::string& w, const nlohmann::json& p) {
    out += fmt::format("{:>5} {:>2}  {}  {}  {}  {}  {}\n", stage, w,
                       cell(p, "optimizer_state_bytes"), cell(p, "param_bytes"),
                       cell(p, "grad_bytes"), cell(p, "kept_grad_bytes"), cell(p, "vm_hwm_bytes"));
  };
  line("0", "any", r.at("stage0"));
  for (const auto& [stage, worlds] : r.at("stages").items())
    for (const auto& [w, p] : worlds.items()) line(stage, w, p);
  return out;
}

}  // namespace dsactor::bench
