#include "trainer/model/gpt_config.h"

#include <yaml-cpp/yaml.h>

#include <fmt/format.h>
#include <array>
#include <stdexcept>

namespace dsactor::trainer {
namespace {

struct Preset {
  const char* name;
  GptConfig config;
  const char* use;
};

// Byte-level presets use vocab 256 (the built-in tokenizer); the GPT-2 sizes keep GPT-2's
// vocabulary so their weights move to and from Hugging Face checkpoints.
constexpr std::array kPresets{
    Preset{"tiny", {2, 2, 32, 256, 64}, "tests"},
    Preset{"small", {4, 4, 128, 256, 128}, "the demo"},
    Preset{"gpt2", {12, 12, 768, 50257, 1024}, "124M"},
    Preset{"gpt2-medium", {24, 16, 1024, 50257, 1024}, "350M"},
    Preset{"gpt2-large", {36, 20, 1280, 50257, 1024}, "774M"},
    Preset{"gpt2-xl", {48, 25, 1600, 50257, 1024}, "1558M"},
};

}  // namespace

void GptConfig::validate(const std::string& source) const {
  auto fail = [&](const char* field, int value, const char* rule) {
    throw std::invalid_argument(
        fmt::format("{}: model field '{}' = {} is invalid: {}", source, field, value, rule));
  };
  if (n_layer < 1) fail("n_layer", n_layer, "must be >= 1");
  if (n_head < 1) fail("n_head", n_head, "must be >= 1");
  if (n_embd < 1) fail("n_embd", n_embd, "must be >= 1");
  if (n_embd % n_head != 0) fail("n_embd", n_embd, "must be a multiple of n_head");
  if (vocab_size < 2 || vocab_size > 65536)
    fail("vocab_size", vocab_size, "must be in [2, 65536] (token files hold uint16 tokens)");
  if (block_size < 1) fail("block_size", block_size, "must be >= 1");
}

GptConfig load_model_yaml(const std::filesystem::path& file) {
  if (!std::filesystem::exists(file)) {
    throw std::invalid_argument(
        fmt::format("model '{}' is neither a preset ({}) nor an existing YAML file", file.string(),
                    model_presets_help()));
  }
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string());
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(fmt::format("{}: not valid YAML: {}", file.string(), e.what()));
  }
  if (!root.IsMap()) throw std::invalid_argument(file.string() + ": expected a mapping");
  GptConfig c;
  const std::array<std::pair<const char*, int*>, 5> fields{{{"n_layer", &c.n_layer},
                                                            {"n_head", &c.n_head},
                                                            {"n_embd", &c.n_embd},
                                                            {"vocab_size", &c.vocab_size},
                                                            {"block_size", &c.block_size}}};
  for (const auto& kv : root) {
    const auto key = kv.first.as<std::string>();
    bool known = false;
    for (const auto& [name, _] : fields) known |= key == name;
    if (!known)
      throw std::invalid_argument(fmt::format(
          "{}: unknown model key '{}'; allowed: n_layer, n_head, n_embd, vocab_size, block_size",
          file.string(), key));
  }
  for (const auto& [name, dst] : fields) {
    if (!root[name])
      throw std::invalid_argument(fmt::format("{}: missing model key '{}'", file.string(), name));
    try {
      *dst = root[name].as<int>();
    } catch (const YAML::Exception&) {
      throw std::invalid_argument(fmt::format("{}: model key '{}' must be an integer, got '{}'",
                                              file.string(), name,
                                              root[name].as<std::string>("?")));
    }
  }
  c.validate(file.string());
  return c;
}

GptConfig resolve_model(const std::string& preset_or_file) {
  for (const auto& p : kPresets)
    if (preset_or_file == p.name) return p.config;
  return load_model_yaml(preset_or_file);
}

std::string model_presets_help() {
  std::string s;
  for (const auto& p : kPresets) {
    if (!s.empty()) s += ", ";
    s += fmt::format("{} ({})", p.name, p.use);
  }
  return s;
}

}  // namespace dsactor::trainer
