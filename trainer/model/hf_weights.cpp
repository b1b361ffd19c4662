#include "trainer/model/hf_weights.h"

#include <fmt/format.h>

#include <cstring>
#include <set>
#include <stdexcept>

#include "kernels/cpu/cast.h"
#include "storage/safetensors.h"

namespace dsactor::trainer {
namespace {

// Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are [in, out] in HF.
bool is_conv1d_weight(const std::string& name) {
  return name.ends_with(".weight") &&
         (name.find("attn.c_") != std::string::npos || name.find("mlp.c_") != std::string::npos);
}

std::string full_name(const BlockLayout& b, const TensorSlot& t) {
  return b.kind == BlockKind::kLayer ? b.name + "." + t.name : t.name;
}

// The HF shape of a slot and the number of rows it holds (wte: the real vocabulary only).
std::vector<int64_t> hf_shape(const GptConfig& c, const std::string& name,
                              const std::vector<int64_t>& shape) {
  if (name == "wte.weight") return {c.vocab_size, shape[1]};
  if (is_conv1d_weight(name)) return {shape[1], shape[0]};
  return shape;
}

}  // namespace

void export_hf_safetensors(const std::filesystem::path& file, const GptConfig& c,
                           const BlockSet& params,
                           const std::map<std::string, std::string>& metadata) {
  const auto layouts = gpt_block_layouts(c);
  std::map<std::string, storage::TensorData> tensors;
  for (size_t b = 0; b < layouts.size(); ++b) {
    for (const auto& t : layouts[b].tensors) {
      const std::string name = full_name(layouts[b], t);
      const float* src = params.blocks[b].data() + t.offset;
      storage::TensorData d;
      d.dtype = "F32";
      d.shape = hf_shape(c, name, t.shape);
      const size_t n = storage::shape_elements(d.shape);
      d.bytes.resize(n * sizeof(float));
      auto* dst = reinterpret_cast<float*>(d.bytes.data());
      if (is_conv1d_weight(name)) {
        const size_t out = t.shape[0], in = t.shape[1];
        for (size_t o = 0; o < out; ++o)
          for (size_t i = 0; i < in; ++i) dst[i * out + o] = src[o * in + i];
      } else {
        std::memcpy(dst, src, n * sizeof(float));
      }
      tensors.emplace(name, std::move(d));
    }
  }
  std::map<std::string, std::string> meta{{"format", "pt"},
                                          {"producer", "dsactor"},
                                          {"n_layer", std::to_string(c.n_layer)},
                                          {"n_head", std::to_string(c.n_head)},
                                          {"n_embd", std::to_string(c.n_embd)},
                                          {"vocab_size", std::to_string(c.vocab_size)},
                                          {"block_size", std::to_string(c.block_size)}};
  meta.insert(metadata.begin(), metadata.end());
  storage::write_safetensors(file, tensors, meta);
}

GptConfig hf_safetensors_config(const std::filesystem::path& file) {
  return hf_safetensors_config(storage::read_safetensors(file), file);
}

GptConfig hf_safetensors_config(const storage::SafetensorsFile& f,
                                const std::filesystem::path& file) {
  GptConfig c;
  const std::pair<const char*, int*> fields[] = {{"n_layer", &c.n_layer},
                                                 {"n_head", &c.n_head},
                                                 {"n_embd", &c.n_embd},
                                                 {"vocab_size", &c.vocab_size},
                                                 {"block_size", &c.block_size}};
  for (const auto& [key, dst] : fields) {
    auto it = f.metadata.find(key);
    if (it == f.metadata.end())
      throw std::invalid_argument(fmt::format(
          "{}: __metadata__ has no '{}', so the model shape is unknown; pass --model too",
          file.string(), key));
    try {
      *dst = std::stoi(it->second);
    } catch (const std::exception&) {
      throw std::invalid_argument(fmt::format("{}: __metadata__ '{}' = '{}' is not an integer",
                                              file.string(), key, it->second));
    }
  }
  c.validate(file.string());
  return c;
}

void import_hf_safetensors(const std::filesystem::path& file, const GptConfig& c,
                           BlockSet& params) {
  import_hf_safetensors(storage::read_safetensors(file), file, c, params);
}

void import_hf_safetensors(const storage::SafetensorsFile& f, const std::filesystem::path& file,
                           const GptConfig& c, BlockSet& params) {
  const auto layouts = gpt_block_layouts(c);
  // Normalise names first: strip "transformer.", drop buffers HF stores beside the weights.
  std::map<std::string, const storage::TensorData*> by_name;
  for (const auto& [raw, data] : f.tensors) {
    std::string name = raw.starts_with("transformer.") ? raw.substr(12) : raw;
    if (name.ends_with("attn.bias") && name.find("c_attn") == std::string::npos) continue;
    if (name.ends_with("attn.masked_bias") || name == "lm_head.weight") continue;
    by_name[name] = &data;
  }
  BlockSet staged = BlockSet::zeros(layouts);
  std::set<std::string> used;
  for (size_t b = 0; b < layouts.size(); ++b) {
    for (const auto& t : layouts[b].tensors) {
      const std::string name = full_name(layouts[b], t);
      auto it = by_name.find(name);
      if (it == by_name.end())
        throw std::invalid_argument(fmt::format("{}: tensor '{}' is missing (model has n_layer={})",
                                                file.string(), name, c.n_layer));
      const auto& d = *it->second;
      const auto want = hf_shape(c, name, t.shape);
      if (d.shape != want)
        throw std::invalid_argument(fmt::format("{}: tensor '{}' has shape [{}], expected [{}]",
                                                file.string(), name, fmt::join(d.shape, ", "),
                                                fmt::join(want, ", ")));
      const size_t n = storage::shape_elements(want);
      std::vector<float> src(n);
      if (d.dtype == "F32") {
        std::memcpy(src.data(), d.bytes.data(), n * sizeof(float));
      } else if (d.dtype == "BF16" || d.dtype == "F16") {
        kernels::cpu::half_to_floats(
            src.data(), reinterpret_cast<const uint16_t*>(d.bytes.data()), n,
            d.dtype == "BF16" ? kernels::cpu::HalfKind::kBF16 : kernels::cpu::HalfKind::kFP16);
      } else {
        throw std::invalid_argument(fmt::format(
            "{}: tensor '{}' has dtype {}; allowed: F32, BF16, F16", file.string(), name, d.dtype));
      }
      float* dst = staged.blocks[b].data() + t.offset;
      if (is_conv1d_weight(name)) {
        const size_t out = t.shape[0], in = t.shape[1];
        for (size_t o = 0; o < out; ++o)
          for (size_t i = 0; i < in; ++i) dst[o * in + i] = src[i * out + o];
      } else {
        std::memcpy(dst, src.data(), n * sizeof(float));
      }
      used.insert(name);
    }
  }
  for (const auto& [name, _] : by_name)
    if (!used.count(name))
      throw std::invalid_argument(
          fmt::format("{}: unexpected tensor '{}' (not part of a GPT-2 with n_layer={})",
                      file.string(), name, c.n_layer));
  params = std::move(staged);
}

}  // namespace dsactor::trainer
