#include "trainer/train_run.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>

#include "trainer/checkpoint_series.h"
#include "trainer/data/batch_loader.h"
#include "trainer/monitor/flops_profiler.h"
#include "trainer/monitor/monitors.h"
#include "trainer/monitor/wall_clock.h"
#include "trainer/run_plan.h"
#include "trainer/runtime/step_engine.h"
#include "trainer/tokenizer_record.h"
#include "trainer/zero/zero_engine.h"

namespace dsactor::trainer {

std::filesystem::path find_checkpoint(const std::filesystem::path& dir) {
  const auto found = resolve_checkpoint(dir);
  if (std::filesystem::exists(found / "manifest.json")) return found;
  throw std::invalid_argument(
      fmt::format("{}: no checkpoint here (looked for {}, {}/latest and {}/checkpoint)",
                  dir.string(), (found / "manifest.json").string(), dir.string(), dir.string()));
}

namespace {

// What a run of either engine reads: the config, the data and where it started from.
struct TrainInputs {
  const TrainOptions& o;
  const TrainCallbacks& cb;
  const DsConfig& config;
  const GptConfig& gpt;
  const TrainingData& data;
  // The tokenizer the --init weights record (checked against the data's when loaded).
  std::optional<TokenizerId> init_tokenizer;
};

// The --resume checkpoint (weights, optimizer, data cursor), refused when it was trained
// with another tokenizer than `used` (this run's, if any). Returns the tokenizer it records.
template <class EngineT>
std::optional<TokenizerId> resume(const TrainOptions& o, EngineT& engine, BatchLoader& train,
                                  const Tokenizer* used) {
  const auto dir = find_checkpoint(*o.resume);
  const auto extra = engine.load_checkpoint(dir);
  const auto resumed = tokenizer_from_extra(extra);
  if (used) check_same_tokenizer(resumed, used->id(), dir.string());
  train.restore(extra.at("train_cursor"));
  spdlog::info("resumed from {} at step {}", dir.string(), engine.global_step());
  return resumed;
}

// The step loop, evaluation, monitors and checkpoints of `dsactor train`, for either engine.
template <class EngineT>
TrainSummary train(const TrainInputs& in, EngineT& engine) {
  const TrainOptions& o = in.o;
  const TrainCallbacks& cb = in.cb;
  const DsConfig& config = in.config;
  const DataSplit& split = in.data.split;
  const int B = static_cast<int>(config.train_micro_batch_size_per_gpu);
  const int T = sequence_length(o.seq_len, in.gpt);
  BatchLoader train(&split.train, B, T, o.shuffle, o.seed);
  std::optional<TokenizerId> started_from = in.init_tokenizer;
  if (o.resume) {
    if (auto resumed = resume(o, engine, train, in.data.tokenizer.get())) started_from = resumed;
  }
  const auto recorded =
      in.data.tokenizer ? std::optional<TokenizerId>(in.data.tokenizer->id()) : started_from;
  const int64_t target = target_steps(o.steps, config);

  Monitors monitors(config, o.out / "monitor");
  FlopsProfiler profiler(config, in.gpt);
  StepEngineOf<EngineT> steps(engine, config.flops_profiler.enabled ? &profiler : nullptr);
  std::optional<WallClockBreakdown> wall_clock;
  if (config.wall_clock_breakdown) wall_clock.emplace();
  auto monitor = [&](const std::string& event, int64_t step, double value) {
    monitors.write(event, step, value);
  };

  const bool have_val = split.val.size() > static_cast<size_t>(B) * T + 1;
  auto validate = [&]() -> float {
    if (!have_val) return 0.0f;
    BatchLoader val(&split.val, B, T, /*shuffle=*/false, o.seed);
    const int n = static_cast<int>(std::min<int64_t>(o.eval_batches, val.batches_per_epoch()));
    return engine.evaluate(val, std::max(n, 1));
  };
  CheckpointSeries checkpoints(CheckpointPolicy{o.checkpoint_dir.value_or(o.out / "checkpoint"),
                                                o.checkpoint_every, o.keep_last},
                               0, nullptr);
  const auto save = [&]() {
    nlohmann::json extra{
        {"train_cursor", train.cursor()}, {"data", o.data.string()}, {"seed", o.seed}};
    if (recorded) extra["tokenizer"] = tokenizer_json(*recorded);
    CheckpointSeries::Retire retire;
    if constexpr (requires(const std::filesystem::path& dir) { engine.retire_checkpoint(dir); })
      retire = [&](const std::filesystem::path& dir) { engine.retire_checkpoint(dir); };
    return checkpoints.save(
        engine.global_step(),
        [&](const std::filesystem::path& dir) { engine.save_checkpoint(dir, extra); }, retire);
  };

  TrainSummary s;
  s.model = in.gpt;
  s.tokenizer = in.data.tokenizer;
  s.unigram_entropy = unigram_entropy(split.train);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  while (engine.global_step() < target) {
    const StepResult r = steps.train_step(train);
    if (wall_clock) wall_clock->add(r);
    tokens += static_cast<int64_t>(B) * T * config.gradient_accumulation_steps;
    s.last_train_loss = r.loss;
    TrainProgress p{r, target, 0, 0};
    p.elapsed_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    p.tokens_per_second = tokens / std::max(p.elapsed_seconds, 1e-9);
    monitors.write_step(r, engine.precision() == Precision::kFp16);
    if (cb.on_step) cb.on_step(p);
    if (cb.log_steps && config.steps_per_print > 0 && r.global_step % config.steps_per_print == 0)
      spdlog::info("step {}/{} loss {:.4f} lr {:.3e} grad_norm {:.3f}{} {:.0f} tok/s",
                   r.global_step, target, r.loss, r.lr, r.grad_norm,
                   r.skipped ? " (skipped: fp16 overflow)" : "", p.tokens_per_second);
    if (wall_clock && config.steps_per_print > 0 && r.global_step % config.steps_per_print == 0)
      spdlog::info("{}", *wall_clock->take_line());
    if (o.eval_every > 0 && r.global_step % o.eval_every == 0 && have_val) {
      const float v = validate();
      monitor("Eval/Samples/val_loss", r.global_step, v);
      if (cb.on_eval) cb.on_eval(r.global_step, v);
    }
    if (checkpoints.due(r.global_step)) s.checkpoint = save();
    s.tokens_per_second = p.tokens_per_second;
  }
  s.val_loss = validate();
  if (have_val) monitor("Eval/Samples/val_loss", engine.global_step(), s.val_loss);
  if (cb.on_eval && have_val) cb.on_eval(engine.global_step(), s.val_loss);
  s.steps = engine.global_step();
  s.skipped_steps = engine.skipped_steps();
  if (checkpoints.last_saved_step() != engine.global_step()) s.checkpoint = save();
  return s;
}

}  // namespace

TrainSummary run_training(const TrainOptions& o, const TrainCallbacks& cb) {
  const DsConfig config = load_ds_config(o.config, 1, parse_config_overrides(o.config_overrides));
  // One process: no offload services (refused with what to run instead), world size 1.
  const EngineChoice choice = choose_engine(config, 0);
  if (choice == EngineChoice::kStage0) check_supported(config);
  const GptConfig gpt = resolve_model(o.model);
  const int T = sequence_length(o.seq_len, gpt);
  const TrainingData data = load_training_data(o.data, gpt, o.val_fraction, o.tokenizer);
  spdlog::info(
      "data {}: {} train tokens, {} val tokens ({} tokenizer); micro-batch {} x {} tokens, {} "
      "micro-steps; ZeRO stage {}",
      o.data.string(), data.split.train.size(), data.split.val.size(),
      data.tokenizer ? data.tokenizer->id().name : "no", config.train_micro_batch_size_per_gpu, T,
      config.gradient_accumulation_steps, config.zero_optimization.stage);
  std::optional<InitialWeights> init;
  if (o.init) {
    init = load_initial_weights(*o.init, gpt, data.tokenizer.get());
    spdlog::info("initial weights from {}", o.init->string());
  }
  const TrainInputs in{o, cb, config, gpt, data, init ? init->tokenizer : std::nullopt};
  if (choice == EngineChoice::kStage0) {
    Engine engine(gpt, config, o.seed);
    if (init) {
      engine.master_params() = std::move(init->params);
      engine.refresh_working_params();
    }
    return train(in, engine);
  }
  ZeroOptions zo;  // the partitions on this one rank, no services
  if (init) zo.initial_weights = initial_weights_from(init->params);
  ZeroEngine engine(gpt, config, o.seed, zo);
  init.reset();  // the engine holds them now
  return train(in, engine);
}

}  // namespace dsactor::trainer
