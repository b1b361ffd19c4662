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
  std::filesystem::path config;                 // ds_config .json / .yaml
  std::vector<std::string> config_overrides;    // --set key.path=value, applied to config
  std::string model = "tiny";                   // preset or model YAML
  std::filesystem::path data;                   // text file/dir or llm.c token file
  std::string tokenizer;                        // text's tokenizer (load_tokenizer); "": byte
  std::optional<std::filesystem::path> init;    // safetensors weights to start from
  std::optional<std::filesystem::path> resume;  // checkpoint dir (or an --out dir holding one)
  std::filesystem::path out = "runs/train";     // checkpoint goes to <out>/checkpoint
  std::optional<int64_t> steps;                 // total optimizer steps (global) to reach
  std::optional<int> seq_len;                   // default: the model's block_size
  bool shuffle = true;
  uint64_t seed = 1234;
  double val_fraction = 0.1;
  int eval_every = 0;  // 0: at the end only
  int eval_batches = 8;
  int save_every = 0;  // 0: at the end only
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
  std::filesystem::path checkpoint;
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

// <dir> if it is a checkpoint, else <dir>/checkpoint if that is one; errors say what was
// looked for.
std::filesystem::path find_checkpoint(const std::filesystem::path& dir);

}  // namespace dsactor::trainer
