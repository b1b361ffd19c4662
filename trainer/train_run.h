#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "trainer/data/tokenizer.h"
#include "trainer/engine/engine.h"

namespace dsactor::trainer {

// Everything `dsactor train` takes besides the ds_config itself.
struct TrainOptions {
  std::filesystem::path config;               // ds_config .json / .yaml
  std::vector<std::string> config_overrides;  // --set key.path=value, applied to config
  std::string model = "tiny";                 // preset or model YAML
  std::filesystem::path data;                 // text file/dir or llm.c token file
  std::string tokenizer;                      // text's tokenizer (load_tokenizer); "": byte
  std::optional<std::filesystem::path> init;  // safetensors weights to start from
  // A checkpoint: a tag directory, a directory holding `latest`, or an --out dir holding one.
  std::optional<std::filesystem::path> resume;
  std::filesystem::path out = "runs/train";             // checkpoints go to <out>/checkpoint
  std::optional<std::filesystem::path> checkpoint_dir;  // instead of <out>/checkpoint
  std::optional<int64_t> steps;                         // total optimizer steps (global) to reach
  std::optional<int> seq_len;                           // default: the model's block_size
  bool shuffle = true;
  uint64_t seed = 1234;
  double val_fraction = 0.1;
  int eval_every = 0;  // 0: at the end only
  int eval_batches = 8;
  int64_t checkpoint_every = 0;  // 0: at the end only
  int keep_last = 0;             // 0: every checkpoint tag stays
};

struct TrainProgress {
  StepResult step;
  int64_t target_steps = 0;
  double tokens_per_second = 0;  // over the steps of this invocation
  double elapsed_seconds = 0;
};

struct TrainCallbacks {
  std::function<void(const TrainProgress&)> on_step;
  std::function<void(int64_t step, float val_loss)> on_eval;
  // The steps_per_print log line; off when something else (a TTY progress bar) shows it.
  bool log_steps = true;
};

struct TrainSummary {
  int64_t steps = 0;
  float last_train_loss = 0;
  float val_loss = 0;
  int64_t skipped_steps = 0;
  std::filesystem::path checkpoint;  // the last save's tag directory
  double tokens_per_second = 0;
  // Entropy of the byte/token unigram distribution of the training data (nats): the loss of
  // the best model that ignores context, which a trained model must beat.
  double unigram_entropy = 0;
  GptConfig model;
  // The tokenizer of the data, recorded in the checkpoint; null for a token file read
  // without --tokenizer.
  std::shared_ptr<const Tokenizer> tokenizer;
};

// The whole of `dsactor train`: config, data, engine, loop, evaluation, monitors, checkpoint.
TrainSummary run_training(const TrainOptions& options, const TrainCallbacks& callbacks = {});

// The checkpoint `dir` names (resolve_checkpoint: through `latest`, or <dir>/checkpoint of an
// --out dir) when it holds a manifest; errors say what was looked for.
std::filesystem::path find_checkpoint(const std::filesystem::path& dir);

}  // namespace dsactor::trainer
