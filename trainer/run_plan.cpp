#include "trainer/run_plan.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <stdexcept>

#include "storage/safetensors.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/token_file.h"
#include "trainer/model/hf_weights.h"
#include "trainer/optimizer_step.h"
#include "trainer/tokenizer_record.h"
#include "trainer/zero/zero_engine.h"

namespace dsactor::trainer {

EngineChoice choose_engine(const DsConfig& c, size_t offload_endpoints) {
  const auto& z = c.zero_optimization;
  if (z.stage == 0) return EngineChoice::kStage0;  // Engine refuses offload at stage 0
  check_partitioned_optimizer(c);
  if (ranks_hold_partitions(c) && !z.offload_param.enabled()) return EngineChoice::kZeroOnRanks;
  if (offload_endpoints == 0)
    throw ConfigError(fmt::format(
        "{}: zero_optimization.{} keeps partitions in offload services, and none was given: "
        "start them with `dsactor start --role offload` and pass each with --offload "
        "tcp://HOST:PORT to `dsactor start --role trainer` (or run `dsactor up deploy.yaml`, "
        "which starts both; `dsactor train` runs no services); or set its \"device\" to "
        "\"none\" and the data-parallel ranks hold the partitions themselves",
        c.source, z.offload_optimizer.enabled() ? "offload_optimizer" : "offload_param"));
  return EngineChoice::kZeroOnServices;
}

bool state_on_services(const DsConfig& c, size_t offload_endpoints) {
  return offload_endpoints > 0 && c.zero_optimization.stage >= 1 && !ranks_hold_partitions(c);
}

int sequence_length(std::optional<int> seq, const GptConfig& model) {
  const int T = seq.value_or(model.block_size);
  if (T < 1 || T > model.block_size)
    throw std::invalid_argument(
        fmt::format("--seq {} is outside [1, block_size {}] of the model", T, model.block_size));
  return T;
}

TrainingData load_training_data(const std::filesystem::path& path, const GptConfig& model,
                                double val_fraction, const std::string& tokenizer_spec) {
  TrainingData data;
  const bool token_file = std::filesystem::is_regular_file(path) && is_token_file(path);
  if (!tokenizer_spec.empty() || !token_file) {
    data.tokenizer = load_tokenizer(tokenizer_spec.empty() ? "byte" : tokenizer_spec);
    check_tokenizer_fits(data.tokenizer->id(), model);
  }
  data.split = split_train_val(
      token_file ? read_token_file(path) : tokenize_text({path}, *data.tokenizer), val_fraction);
  // A token file read with --tokenizer must hold that tokenizer's ids.
  const int limit = data.tokenizer ? data.tokenizer->vocab_size() : model.vocab_size;
  for (int32_t t : data.split.train)
    if (t >= limit)
      throw std::invalid_argument(
          fmt::format("{}: token {} does not fit the {} {}", path.string(), t,
                      data.tokenizer ? "vocabulary of tokenizer " + data.tokenizer->id().name
                                     : std::string("model's vocab_size"),
                      limit));
  return data;
}

InitialWeights load_initial_weights(const std::filesystem::path& file, const GptConfig& model,
                                    const Tokenizer* tokenizer) {
  const storage::SafetensorsFile f = storage::read_safetensors(file);
  InitialWeights w{BlockSet::zeros(gpt_block_layouts(model)), tokenizer_from_metadata(f.metadata)};
  if (tokenizer) check_same_tokenizer(w.tokenizer, tokenizer->id(), file.string());
  import_hf_safetensors(f, file, model, w.params);
  return w;
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
