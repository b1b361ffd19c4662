#include "trainer/run_plan.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <stdexcept>

#include "trainer/data/byte_tokenizer.h"

namespace dsactor::trainer {

int sequence_length(std::optional<int> seq, const GptConfig& model) {
  const int T = seq.value_or(model.block_size);
  if (T < 1 || T > model.block_size)
    throw std::invalid_argument(
        fmt::format("--seq {} is outside [1, block_size {}] of the model", T, model.block_size));
  return T;
}

DataSplit load_training_data(const std::filesystem::path& path, const GptConfig& model,
                             double val_fraction) {
  DataSplit split = split_train_val(load_tokens(path), val_fraction);
  for (int32_t t : split.train)
    if (t >= model.vocab_size)
      throw std::invalid_argument(fmt::format("{}: token {} does not fit the model's vocab_size {}",
                                              path.string(), t, model.vocab_size));
  return split;
}

int64_t target_steps(std::optional<int64_t> steps, const DsConfig& config) {
  if (steps) return *steps;
  return config.scheduler.total_num_steps > 0 ? config.scheduler.total_num_steps : 100;
}

double unigram_entropy(const std::vector<int32_t>& tokens) {
  std::map<int32_t, size_t> counts;
  for (int32_t t : tokens) ++counts[t];
  double h = 0;
  for (const auto& [_, n] : counts) {
    const double p = static_cast<double>(n) / static_cast<double>(tokens.size());
    h -= p * std::log(p);
  }
  return h;
}

}  // namespace dsactor::trainer
