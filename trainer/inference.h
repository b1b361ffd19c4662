#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/data/tokenizer.h"
#include "trainer/model/gpt.h"

namespace dsactor::trainer {

class BatchLoader;

// The model shape recorded in a checkpoint's state; errors name the directory.
GptConfig model_of_checkpoint(const nlohmann::json& state, const std::filesystem::path& dir);

// The fp32 master weights of a training checkpoint, crc-checked, without its optimizer state,
// and the tokenizer the model was trained with when the checkpoint records one.
struct LoadedWeights {
  GptConfig config;
  BlockSet params;
  std::optional<TokenizerId> tokenizer;
};
// `dir`: a checkpoint, or a directory naming one through `latest` (resolve_checkpoint).
LoadedWeights load_checkpoint_weights(const std::filesystem::path& dir);
// A Hugging Face style safetensors file: the shape from `model` (a preset or model YAML) when
// given, else from __metadata__ (what `dsactor export` writes; Hugging Face's own files have
// none); the tokenizer record from __metadata__.
LoadedWeights load_safetensors_weights(const std::filesystem::path& file,
                                       const std::string& model = "");

// Mean loss over the next `batches` batches of `loader` (no gradients).
float evaluate_loss(GptModel& model, BlockSet& params, BatchLoader& loader, int batches);

// Continues `prompt` by `new_tokens` tokens: greedy at temperature 0, otherwise sampling from
// softmax(logits / temperature) restricted to the top_k most likely tokens (0 = all).
// Deterministic for a seed. on_token, when set, sees each new token as soon as it is chosen.
std::vector<int32_t> generate_tokens(GptModel& model, BlockSet& params, std::vector<int32_t> prompt,
                                     int new_tokens, float temperature, int top_k, uint64_t seed,
                                     const std::function<void(int32_t)>& on_token = {});

}  // namespace dsactor::trainer
