#include "bench/checkpoint_bench.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <vector>

#include "bench/process_stats.h"
#include "bench/stopwatch.h"
#include "bench/zero_bench.h"
#include "deploy/service_process.h"
#include "trainer/checkpoint_series.h"
#include "trainer/data/batch_loader.h"
#include "trainer/engine/engine.h"
#include "trainer/rng.h"
#include "trainer/zero/zero_engine.h"

namespace dsactor::bench {

namespace fs = std::filesystem;
using namespace dsactor::trainer;

namespace {

// Bytes of the files under `dir` whose path names `tag` (every file when `tag` is empty).
uint64_t bytes_under(const fs::path& dir, const std::string& tag = {}) {
  uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && (tag.empty() || e.path().string().find(tag) != std::string::npos))
      total += e.file_size();
  return total;
}

// Two phases of one run: `steps` steps without checkpoints, then `steps` with
// `after_step(i)` after the phase's i-th step (a save when i is a multiple of `every`, so
// the phase's first step saves and each save has its interval's later steps to overlap, as
// in a long run) and `end()` once (the last save finished): each returns how long it held
// the trainer.
struct PhaseTimes {
  double plain_s = 0, with_s = 0;  // per step
  double held_s = 0;               // in saves, all of them
  // CPU seconds per phase: this process (the trainer), and the service (0 without one).
  double plain_cpu_s = 0, with_cpu_s = 0;
  double service_plain_cpu_s = 0, service_with_cpu_s = 0;
};
template <class EngineT>
PhaseTimes time_phases(EngineT& engine, BatchLoader& loader, int warmup, int steps,
                       const std::function<double(int64_t)>& after_step,
                       const std::function<double()>& end, pid_t service = -1) {
  for (int i = 0; i < warmup; ++i) engine.train_step(loader);
  PhaseTimes t;
  const auto cpu = [] {
    const auto [user, sys] = own_cpu_seconds();
    return user + sys;
  };
  double cpu0 = cpu(), service0 = process_cpu_seconds(service);
  auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) engine.train_step(loader);
  t.plain_s = seconds_since(t0) / steps;
  t.plain_cpu_s = cpu() - cpu0;
  t.service_plain_cpu_s = process_cpu_seconds(service) - service0;
  cpu0 = cpu(), service0 = process_cpu_seconds(service);
  t0 = Clock::now();
  for (int i = 0; i < steps; ++i) {
    engine.train_step(loader);
    t.held_s += after_step(i);
  }
  t.held_s += end();
  t.with_s = seconds_since(t0) / steps;
  t.with_cpu_s = cpu() - cpu0;
  t.service_with_cpu_s = process_cpu_seconds(service) - service0;
  return t;
}

double timed(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return seconds_since(t0);
}

struct Measured {
  PhaseTimes times;
  int saves = 0;
  uint64_t checkpoint_bytes = 0;  // of the newest save, every part
  // Summed over the saves published: steps and seconds from begin to publication.
  double publish_steps = 0, publish_s = 0;
};

// Stage 0: the trainer writes everything, synchronously, as `train --checkpoint-every` does.
Measured run_stage0(const CheckpointBenchOptions& o, const GptConfig& gpt, const DsConfig& config,
                    BatchLoader& loader, CheckpointSeries& series, int steps) {
  Engine engine(gpt, config, o.seed);
  Measured m;
  std::optional<fs::path> newest;
  m.times = time_phases(
      engine, loader, o.warmup_steps, steps,
      [&](int64_t i) {
        if (i % o.every != 0) return 0.0;
        const int64_t step = engine.global_step();
        ++m.saves;
        return timed([&] {
          newest = series.save(step, [&](const fs::path& d) {
            engine.save_checkpoint(d, {{"train_cursor", loader.cursor()}});
          });
        });
      },
      [] { return 0.0; });
  if (newest) m.checkpoint_bytes = bytes_under(*newest);
  return m;
}

// ZeRO-3 on a RAM-tier offload service (a child process): the trainer asks for the save
// and writes its manifest; the service snapshots the job and writes its part while the
// next step runs; the save is published at the next step boundary, as `dsactor start --role
// trainer --checkpoint-every` does. The trainer is held by the request and by whatever of
// the service's write is left at the next boundary.
Measured run_offloaded(const CheckpointBenchOptions& o, const GptConfig& gpt, nlohmann::json cfg,
                       BatchLoader& loader, CheckpointSeries& series, int steps,
                       const fs::path& work) {
  const Stage3Knobs knobs = lean_stage3_knobs(o.model);
  cfg["zero_optimization"] = {{"stage", 3},
                              {"offload_optimizer", {{"device", "cpu"}}},
                              {"offload_param", {{"device", "cpu"}}},
                              {"stage3_prefetch_bucket_size", knobs.prefetch_bucket},
                              {"stage3_max_live_parameters", knobs.max_live}};
  const fs::path state = work / "service-state";
  deploy::ServiceProcess service(fs::read_symlink("/proc/self/exe").string(),
                                 {"--state-dir", state.string()}, work / "offload.log");
  ZeroOptions zo;
  zo.services = {service.endpoint()};
  zo.service_security = {service.client_security()};
  zo.job_id = "bench-checkpoint";
  ZeroEngine engine(gpt, parse_ds_config(cfg, "bench checkpoint"), o.seed, zo);
  Measured m;
  std::optional<fs::path> newest;
  // Each publication: the save's interval from begin to publish, in steps and seconds.
  const auto published = [&](std::optional<fs::path> tag) {
    if (!tag) return;
    newest = std::move(tag);
    const auto& p = series.last_publication();
    m.publish_steps += static_cast<double>(p.published_at_step - p.saved_step);
    m.publish_s += p.seconds;
  };
  m.times = time_phases(
      engine, loader, o.warmup_steps, steps,
      [&](int64_t i) {
        double held = timed([&] { published(series.publish_if_written(engine.global_step())); });
        if (i % o.every != 0) return held;
        const int64_t step = engine.global_step();
        ++m.saves;
        held += timed([&] {
          series.begin(
              step,
              [&](const fs::path& d) {
                engine.begin_checkpoint(d, {{"train_cursor", loader.cursor()}});
                return CheckpointSeries::PartInFlight{[&] { return engine.checkpoint_written(); },
                                                      [&] { return engine.finish_checkpoint(); }};
              },
              [&](const fs::path& d) { engine.retire_checkpoint(d); });
        });
        return held;
      },
      [&] { return timed([&] { published(series.finish(engine.global_step())); }); },
      service.pid());
  if (newest)
    m.checkpoint_bytes = bytes_under(*newest) + bytes_under(state, newest->filename().string());
  engine.drop_jobs();
  return m;
}

}  // namespace

nlohmann::json run_checkpoint_bench(const CheckpointBenchOptions& o) {
  if (o.path != "stage0" && o.path != "offload")
    throw std::invalid_argument("bench checkpoint: --path must be stage0 or offload, not " +
                                o.path);
  const int steps = o.steps > 0 ? o.steps : o.every;
  const GptConfig gpt = resolve_model(o.model);
  const nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", o.micro_batch},
                              {"gradient_accumulation_steps", 1},
                              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}}};
  // Synthetic tokens: the speed of a step does not depend on what the tokens say.
  Rng rng(o.seed);
  std::vector<int32_t> tokens(
      static_cast<size_t>(o.micro_batch) * o.seq * (2 * steps + o.warmup_steps + 1) + 1);
  for (auto& t : tokens)
    t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(gpt.vocab_size));
  BatchLoader loader(&tokens, o.micro_batch, o.seq, false, o.seed);

  std::string tmpl = (fs::temp_directory_path() / "dsactor-bench-checkpoint-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("bench checkpoint: mkdtemp failed");
  const fs::path work = tmpl;
  const fs::path dir = o.dir.empty() ? work / "checkpoints" : fs::path(o.dir);
  CheckpointSeries series(CheckpointPolicy{dir, o.every, o.keep_last}, 0, nullptr);
  const double load_begin = load_average();
  Measured m;
  try {
    m = o.path == "stage0"
            ? run_stage0(o, gpt, parse_ds_config(cfg, "bench checkpoint"), loader, series, steps)
            : run_offloaded(o, gpt, cfg, loader, series, steps, work);
  } catch (...) {
    fs::remove_all(work);
    throw;
  }
  fs::remove_all(work);
  const PhaseTimes& t = m.times;
  const double mean_save = m.saves > 0 ? t.held_s / m.saves : 0;
  const double per_save = m.saves > 0 ? 1.0 / m.saves : 0;
  return {{"model", o.model},
          {"path", o.path},
          {"parameters", parameter_count(gpt)},
          {"micro_batch", o.micro_batch},
          {"seq", o.seq},
          {"every", o.every},
          {"steps_per_phase", steps},
          {"saves", m.saves},
          {"checkpoint_bytes", m.checkpoint_bytes},
          {"ms_per_step_without", t.plain_s * 1e3},
          {"ms_per_step_with", t.with_s * 1e3},
          {"save_ms", mean_save * 1e3},
          {"overhead_fraction", (t.with_s - t.plain_s) / t.plain_s},
          {"save_overhead_fraction", mean_save / (o.every * t.plain_s)},
          {"publish_steps", m.publish_steps * per_save},
          {"publish_ms", m.publish_s * per_save * 1e3},
          {"trainer_cpu_ms_per_step_without", t.plain_cpu_s / steps * 1e3},
          {"trainer_cpu_ms_per_step_with", t.with_cpu_s / steps * 1e3},
          {"service_cpu_ms_per_step_without", t.service_plain_cpu_s / steps * 1e3},
          {"service_cpu_ms_per_step_with", t.service_with_cpu_s / steps * 1e3},
          // What a save added to the service's CPU: its write, and the copy-on-write of the
          // steps while it was written.
          {"service_save_cpu_s", (t.service_with_cpu_s - t.service_plain_cpu_s) * per_save},
          {"load_average_begin", load_begin},
          {"load_average_end", load_average()},
          {"goal_fraction", 0.03}};
}

}  // namespace dsactor::bench
