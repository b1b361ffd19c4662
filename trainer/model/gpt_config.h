#pragma once
#include <filesystem>
#include <string>

namespace dsactor::trainer {

// Shape of a GPT-2 family model. vocab_size is the real vocabulary; kernels see it padded to
// a multiple of 64 (padded_vocab) so the LM-head sgemm has friendly sizes, and the padded
// logits never enter the loss.
struct GptConfig {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int vocab_size = 0;
  int block_size = 0;  // longest sequence (rows of wpe)

  int padded_vocab() const { return (vocab_size + 63) / 64 * 64; }
  int head_size() const { return n_embd / n_head; }
  // Throws std::invalid_argument naming the field when the shape is unusable.
  void validate(const std::string& source) const;
  bool operator==(const GptConfig&) const = default;
};

// Presets: tiny (tests), small (the demo), gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl.
// Anything else is taken as the path of a YAML model file with the five keys above.
GptConfig resolve_model(const std::string& preset_or_file);
GptConfig load_model_yaml(const std::filesystem::path& file);
std::string model_presets_help();

}  // namespace dsactor::trainer
