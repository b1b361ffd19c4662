#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/metrics_flags.h"
#include "cli/progress_bar.h"
#include "trainer/data/byte_tokenizer.h"
#include "trainer/inference.h"
#include "trainer/monitor/train_metrics.h"
#include "trainer/train_run.h"

namespace dsactor::cli {

namespace {

// A sample from the trained weights, decoded (nothing when the data's tokens have no
// tokenizer to decode them).
void print_sample(const trainer::TrainSummary& s, int tokens, uint64_t seed) {
  // A token file read without --tokenizer: bytes, if the model's vocabulary is theirs.
  std::shared_ptr<const trainer::Tokenizer> tokenizer = s.tokenizer;
  if (!tokenizer && s.model.vocab_size == trainer::kByteVocabSize)
    tokenizer = std::make_shared<trainer::ByteTokenizer>();
  if (!tokenizer) return;
  auto w = trainer::load_checkpoint_weights(s.checkpoint);
  trainer::GptModel model(w.config);
  // A new document: GPT-2's separator where the tokenizer has one, else a line break.
  const auto separator = tokenizer->document_separator();
  const auto start = separator ? std::vector<int32_t>{*separator} : tokenizer->encode("\n");
  auto out = trainer::generate_tokens(model, w.params, start, tokens, 0.8f, 40, seed);
  out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(start.size()));
  fmt::print("--- sample ---\n{}{}\n--------------\n", separator ? "" : "\n",
             tokenizer->decode(out));
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "train", "train a GPT model in this process (ZeRO stage 0-3, no offload services)");
  auto o = std::make_shared<trainer::TrainOptions>();
  auto sample = std::make_shared<int>(200);
  auto metrics_args = std::make_shared<MetricsArgs>();
  auto deepspeed = std::make_shared<bool>(false);
  cmd->add_flag(
      "--deepspeed", *deepspeed,
      "accepted as DeepSpeed's scripts pass it; dsactor always runs its DeepSpeed engine, so "
      "it changes nothing");
  cmd->add_option("--config,--deepspeed_config", o->config, "DeepSpeed config (.json or .yaml)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", o->config_overrides,
                  "KEY.PATH=VALUE sets or replaces a ds_config key (repeatable; VALUE is read as "
                  "JSON when it is JSON, else as a string), e.g. filling \"auto\" values: --set "
                  "train_micro_batch_size_per_gpu=4 --set optimizer.params.lr=1e-4");
  cmd->add_option("--model", o->model,
                  "preset (" + trainer::model_presets_help() + ") or model YAML")
      ->capture_default_str();
  cmd->add_option("--data", o->data, "text file or directory, or llm.c token file")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--tokenizer", o->tokenizer,
                  "tokenizer of text data: byte (default), or a GPT-2 tokenizer (directory, "
                  "tokenizer.json, or vocab.json/encoder.json with its merges file)");
  cmd->add_option("--init", o->init, "start from these safetensors weights")
      ->check(CLI::ExistingFile);
  cmd->add_option("--resume", o->resume,
                  "continue from a checkpoint: a tag dir, a dir holding `latest` (the newest "
                  "tag), or an earlier run's --out dir")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--out", o->out, "output dir: checkpoint/ and monitor files")
      ->capture_default_str();
  cmd->add_option("--checkpoint-dir", o->checkpoint_dir,
                  "where checkpoints go: <dir>/global_step<N>/ and <dir>/latest (default "
                  "<out>/checkpoint)");
  cmd->add_option("--steps", o->steps,
                  "total optimizer steps to reach (default: scheduler total_num_steps, else 100)");
  cmd->add_option("--seq", o->seq_len, "sequence length T (default: the model's block_size)");
  cmd->add_flag("--no-shuffle{false}", o->shuffle, "batches in file order (llm.c convention)");
  cmd->add_option("--seed", o->seed, "seed for weights and batch order")->capture_default_str();
  cmd->add_option("--val-fraction", o->val_fraction, "tail of the data held out for validation")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  cmd->add_option("--eval-every", o->eval_every, "validate every N steps (0: at the end)");
  cmd->add_option("--eval-batches", o->eval_batches, "validation batches")->capture_default_str();
  cmd->add_option("--checkpoint-every,--save-every", o->checkpoint_every,
                  "checkpoint every N steps besides the end (0: at the end only)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--keep-last", o->keep_last,
                  "keep the newest K checkpoint tags, removing older ones once a new one is "
                  "complete (0: keep every tag)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--sample", *sample, "tokens to generate after training (0: none)")
      ->capture_default_str();
  add_metrics_options(*cmd, *metrics_args);
  cmd->callback([o, sample, metrics_args, deepspeed] {
    if (*deepspeed)
      spdlog::info("--deepspeed changes nothing: dsactor always runs its DeepSpeed engine");
    metrics::Registry registry(
        metrics::Labels{{"job", "train"}, {"role", "trainer"}, {"rank", "0"}, {"name", "train"}});
    const auto server = serve_metrics(*metrics_args, registry, "train", [&o] {
      return nlohmann::json{{"name", "train"}, {"role", "trainer"}, {"config", o->config}};
    });
    std::optional<trainer::TrainMetrics> train_metrics;
    if (server) train_metrics.emplace(registry);
    ProgressBar bar;
    trainer::TrainCallbacks cb;
    cb.log_steps = !bar.active();
    cb.on_step = [&bar, &train_metrics](const trainer::TrainProgress& p) {
      if (train_metrics) train_metrics->record(p.step, p.target_steps, p.tokens_per_second);
      bar.update(p.step.global_step, p.target_steps,
                 fmt::format("loss {:.4f} | {:.0f} tok/s", p.step.loss, p.tokens_per_second),
                 p.elapsed_seconds);
    };
    cb.on_eval = [&bar](int64_t step, float v) {
      bar.finish();
      spdlog::info("step {}: val loss {:.4f}", step, v);
    };
    const auto s = trainer::run_training(*o, cb);
    bar.finish();
    fmt::print(
        "trained {} steps ({} skipped), final train loss {:.4f}, val loss {:.4f}, {:.0f} "
        "tokens/s\n",
        s.steps, s.skipped_steps, s.last_train_loss, s.val_loss, s.tokens_per_second);
    fmt::print("unigram entropy of the training data: {:.4f} nats/token\n", s.unigram_entropy);
    if (*sample > 0) print_sample(s, *sample, o->seed);
    fmt::print("checkpoint: {}\n", s.checkpoint.string());
  });
}

}  // namespace dsactor::cli
