#pragma once
// What `dsactor train` and `dsactor start --role trainer` decide the same way before their
// first step: the engine, the sequence length, the data checked against the model's
// vocabulary, and the step count to reach.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config/ds_config.h"
#include "trainer/data/batch_loader.h"
#include "trainer/data/tokenizer.h"
#include "trainer/model/gpt_config.h"
#include "trainer/model/param_blocks.h"

namespace dsactor::trainer {

// `seq` (unset: the model's block_size), refused outside [1, block_size] naming --seq.
int sequence_length(std::optional<int> seq, const GptConfig& model);

// Training data and the tokenizer that made it: the one named by --tokenizer, else the byte
// tokenizer for text; none for a token file without --tokenizer (its ids come from elsewhere,
// so the model records no tokenizer).
struct TrainingData {
  DataSplit split;
  std::shared_ptr<const Tokenizer> tokenizer;
};

// The data at `path` (text, directory or token file) split into train and val. Text is
// tokenized with `tokenizer_spec` (load_tokenizer; "" means the byte tokenizer). The
// tokenizer must fit the model's vocab_size, and every train token is checked against it, or
// against vocab_size without one (the error names the file and the token).
TrainingData load_training_data(const std::filesystem::path& path, const GptConfig& model,
                                double val_fraction, const std::string& tokenizer_spec);

// --init: the weights of a Hugging Face style safetensors file for `model`, and the tokenizer
// the file records (Hugging Face's own files record none). Refused, naming both, when it
// records another tokenizer than `tokenizer` (when there is one).
struct InitialWeights {
  BlockSet params;
  std::optional<TokenizerId> tokenizer;
};
InitialWeights load_initial_weights(const std::filesystem::path& file, const GptConfig& model,
                                    const Tokenizer* tokenizer);

// Which engine runs a config: the stage-0 Engine, or the ZeroEngine with the partitions on
// the data-parallel ranks themselves (stages 1-3 without offload_optimizer) or on offload
// services (with it).
enum class EngineChoice { kStage0, kZeroOnRanks, kZeroOnServices };
// Refuses (ConfigError) offload without offload service endpoints, naming where they come
// from; `offload_endpoints` is how many the command was given (`dsactor train`: none).
EngineChoice choose_engine(const DsConfig& config, size_t offload_endpoints);
// Whether the offload services hold all of a trainer's training state (every parameter
// partition with its optimizer state: ZeRO stage 1-3 with offload_optimizer), so that their
// committed step is enough to continue from after the trainer dies.
bool state_on_services(const DsConfig& config, size_t offload_endpoints);

// `steps` when given, else the scheduler's total_num_steps, else 100.
int64_t target_steps(std::optional<int64_t> steps, const DsConfig& config);

// Entropy of the byte/token unigram distribution (nats): the loss of the best model that
// ignores context, which a trained model must beat.
double unigram_entropy(const std::vector<int32_t>& tokens);

}  // namespace dsactor::trainer
