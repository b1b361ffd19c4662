#include "bench/checkpoint_bench.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <vector>

#include "bench/stopwatch.h"
#include "trainer/checkpoint_series.h"
#include "trainer/data/batch_loader.h"
#include "trainer/engine/engine.h"
#include "trainer/rng.h"

namespace dsactor::bench {

namespace fs = std::filesystem;
namespace {

uint64_t bytes_under(const fs::path& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) total += e.file_size();
  return total;
}

}  // namespace

nlohmann::json run_checkpoint_bench(const CheckpointBenchOptions& o) {
  using namespace dsactor::trainer;
  const int steps = o.steps > 0 ? o.steps : o.every;
  const GptConfig gpt = resolve_model(o.model);
  const nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", o.micro_batch},
                              {"gradient_accumulation_steps", 1},
                              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}}};
  const DsConfig config = parse_ds_config(cfg, "bench checkpoint");
  // Synthetic tokens: the speed of a step does not depend on what the tokens say.
  Rng rng(o.seed);
  std::vector<int32_t> tokens(
      static_cast<size_t>(o.micro_batch) * o.seq * (2 * steps + o.warmup_steps + 1) + 1);
  for (auto& t : tokens)
    t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(gpt.vocab_size));
  BatchLoader loader(&tokens, o.micro_batch, o.seq, false, o.seed);
  Engine engine(gpt, config, o.seed);
  for (int i = 0; i < o.warmup_steps; ++i) engine.train_step(loader);

  auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) engine.train_step(loader);
  const double plain_s = seconds_since(t0) / steps;

  const bool temporary = o.dir.empty();
  const fs::path dir = temporary ? fs::temp_directory_path() /
                                       ("dsactor-bench-checkpoint-" + std::to_string(::getpid()))
                                 : fs::path(o.dir);
  CheckpointSeries series(CheckpointPolicy{dir, o.every, o.keep_last}, 0, nullptr);
  double save_s = 0;
  int saves = 0;
  uint64_t checkpoint_bytes = 0;
  t0 = Clock::now();
  for (int i = 0; i < steps; ++i) {
    engine.train_step(loader);
    if (!series.due(engine.global_step())) continue;
    const auto s0 = Clock::now();
    const auto tag = series.save(engine.global_step(), [&](const fs::path& d) {
      engine.save_checkpoint(d, {{"train_cursor", loader.cursor()}});
    });
    save_s += seconds_since(s0);
    ++saves;
    checkpoint_bytes = bytes_under(tag);
  }
  const double with_s = seconds_since(t0) / steps;
  if (temporary) fs::remove_all(dir);
  const double mean_save = saves > 0 ? save_s / saves : 0;
  return {{"model", o.model},
          {"parameters", parameter_count(gpt)},
          {"micro_batch", o.micro_batch},
          {"seq", o.seq},
          {"every", o.every},
          {"steps_per_phase", steps},
          {"saves", saves},
          {"checkpoint_bytes", checkpoint_bytes},
          {"ms_per_step_without", plain_s * 1e3},
          {"ms_per_step_with", with_s * 1e3},
          {"save_ms", mean_save * 1e3},
          {"overhead_fraction", (with_s - plain_s) / plain_s},
          {"save_overhead_fraction", mean_save / (o.every * plain_s)},
          {"goal_fraction", 0.03}};
}

}  // namespace dsactor::bench
