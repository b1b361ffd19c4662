#include "trainer/inference.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "kernels/cpu/crossentropy.h"
#include "storage/checkpoint.h"
#include "trainer/checkpoint_series.h"
#include "trainer/data/batch_loader.h"
#include "trainer/model/hf_weights.h"
#include "trainer/rng.h"
#include "trainer/tokenizer_record.h"

namespace dsactor::trainer {

GptConfig model_of_checkpoint(const nlohmann::json& state, const std::filesystem::path& dir) {
  try {
    const auto& m = state.at("model");
    GptConfig c{m.at("n_layer").get<int>(), m.at("n_head").get<int>(), m.at("n_embd").get<int>(),
                m.at("vocab_size").get<int>(), m.at("block_size").get<int>()};
    c.validate(dir.string());
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(
        fmt::format("{}: checkpoint state has no valid 'model' entry: {}", dir.string(), e.what()));
  }
}

LoadedWeights load_checkpoint_weights(const std::filesystem::path& named) {
  const std::filesystem::path dir = resolve_checkpoint(named);
  storage::CheckpointReader r(dir);
  LoadedWeights w{model_of_checkpoint(r.state(), dir), {}, {}};
  if (r.state().contains("extra")) w.tokenizer = tokenizer_from_extra(r.state().at("extra"));
  const auto layouts = gpt_block_layouts(w.config);
  w.params = BlockSet::zeros(layouts);
  for (size_t b = 0; b < layouts.size(); ++b)
    r.read_tensor("params/" + layouts[b].name, w.params.blocks[b].data(),
                  w.params.blocks[b].bytes(), "F32");
  return w;
}

LoadedWeights load_safetensors_weights(const std::filesystem::path& file,
                                       const std::string& model) {
  const storage::SafetensorsFile f = storage::read_safetensors(file);
  LoadedWeights w{model.empty() ? hf_safetensors_config(f, file) : resolve_model(model),
                  {},
                  tokenizer_from_metadata(f.metadata)};
  w.params = BlockSet::zeros(gpt_block_layouts(w.config));
  import_hf_safetensors(f, file, w.config, w.params);
  return w;
}

float evaluate_loss(GptModel& model, BlockSet& params, BatchLoader& loader, int batches) {
  if (batches < 1) throw std::invalid_argument("evaluate: the number of batches must be >= 1");
  const int B = loader.micro_batch(), T = loader.seq_len();
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    loader.next(inputs.data(), targets.data());
    sum += model.forward_loss(params, inputs.data(), targets.data(), B, T);
  }
  return static_cast<float>(sum / batches);
}

std::vector<int32_t> generate_tokens(GptModel& model, BlockSet& params, std::vector<int32_t> tokens,
                                     int new_tokens, float temperature, int top_k, uint64_t seed,
                                     const std::function<void(int32_t)>& on_token) {
  if (tokens.empty()) throw std::invalid_argument("generate: the prompt is empty");
  if (temperature < 0) throw std::invalid_argument("generate: --temperature must be >= 0");
  const GptConfig& c = model.config();
  const int V = c.vocab_size, Vp = c.padded_vocab();
  Rng rng(seed);
  std::vector<float> probs(V);
  std::vector<int> order(V);
  for (int n = 0; n < new_tokens; ++n) {
    const int T = std::min<int>(static_cast<int>(tokens.size()), c.block_size);
    const int32_t* window = tokens.data() + tokens.size() - T;
    const float* logits =
        model.forward_logits(params, window, 1, T) + static_cast<size_t>(T - 1) * Vp;
    int next = 0;
    if (temperature == 0) {
      next = static_cast<int>(std::max_element(logits, logits + V) - logits);
    } else {
      kernels::cpu::softmax_row(probs.data(), logits, V, temperature);
      if (top_k > 0 && top_k < V) {
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int a, int b) {
          return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
        });
        for (int i = top_k; i < V; ++i) probs[order[i]] = 0.0f;
      }
      double total = 0;
      for (float p : probs) total += p;
      const double u = rng.uniform() * total;
      double acc = 0;
      next = V - 1;
      for (int i = 0; i < V; ++i) {
        acc += probs[i];
        if (u < acc) {
          next = i;
          break;
        }
      }
    }
    tokens.push_back(next);
    if (on_token) on_token(next);
  }
  return tokens;
}

}  // namespace dsactor::trainer
