#pragma once
// What `dsactor train` and `dsactor start --role trainer` decide the same way before their
// first step: the sequence length, the data checked against the model's vocabulary, and the
// step count to reach.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "trainer/config/ds_config.h"
#include "trainer/data/batch_loader.h"
#include "trainer/model/gpt_config.h"

namespace dsactor::trainer {

// `seq` (unset: the model's block_size), refused outside [1, block_size] naming --seq.
int sequence_length(std::optional<int> seq, const GptConfig& model);

// The data at `path` (text, directory or token file) split into train and val, every train
// token checked against the model's vocab_size (the error names the file and the token).
DataSplit load_training_data(const std::filesystem::path& path, const GptConfig& model,
                             double val_fraction);

// `steps` when given, else the scheduler's total_num_steps, else 100.
int64_t target_steps(std::optional<int64_t> steps, const DsConfig& config);

// Entropy of the byte/token unigram distribution (nats): the loss of the best model that
// ignores context, which a trained model must beat.
double unigram_entropy(const std::vector<int32_t>& tokens);

}  // namespace dsactor::trainer
