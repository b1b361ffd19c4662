#include "trainer/model/param_blocks.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "trainer/rng.h"

namespace dsactor::trainer {
namespace {

constexpr size_t kSlotAlign = 16;  // floats: 64 bytes

size_t round_up(size_t n) {
  return (n + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
}

void add(BlockLayout& b, std::string name, std::vector<int64_t> shape) {
  size_t numel = 1;
  for (auto d : shape) numel *= static_cast<size_t>(d);
  b.tensors.push_back({std::move(name), std::move(shape), b.numel, numel});
  b.numel += round_up(numel);
}

}  // namespace

const TensorSlot& BlockLayout::slot(const std::string& tensor_name) const {
  for (const auto& t : tensors)
    if (t.name == tensor_name) return t;
  throw std::out_of_range(fmt::format("block '{}' has no tensor '{}'", name, tensor_name));
}

std::vector<BlockLayout> gpt_block_layouts(const GptConfig& c) {
  const int64_t C = c.n_embd;
  std::vector<BlockLayout> out;
  BlockLayout emb{BlockKind::kEmbedding, -1, "embedding", {}, 0};
  add(emb, "wte.weight", {c.padded_vocab(), C});
  add(emb, "wpe.weight", {c.block_size, C});
  out.push_back(std::move(emb));
  for (int l = 0; l < c.n_layer; ++l) {
    BlockLayout b{BlockKind::kLayer, l, fmt::format("h.{}", l), {}, 0};
    add(b, "ln_1.weight", {C});
    add(b, "ln_1.bias", {C});
    add(b, "attn.c_attn.weight", {3 * C, C});
    add(b, "attn.c_attn.bias", {3 * C});
    add(b, "attn.c_proj.weight", {C, C});
    add(b, "attn.c_proj.bias", {C});
    add(b, "ln_2.weight", {C});
    add(b, "ln_2.bias", {C});
    add(b, "mlp.c_fc.weight", {4 * C, C});
    add(b, "mlp.c_fc.bias", {4 * C});
    add(b, "mlp.c_proj.weight", {C, 4 * C});
    add(b, "mlp.c_proj.bias", {C});
    out.push_back(std::move(b));
  }
  BlockLayout fin{BlockKind::kFinalNorm, -1, "ln_f", {}, 0};
  add(fin, "ln_f.weight", {C});
  add(fin, "ln_f.bias", {C});
  out.push_back(std::move(fin));
  return out;
}

std::vector<size_t> block_numels(const std::vector<BlockLayout>& layouts) {
  std::vector<size_t> n;
  for (const auto& l : layouts) n.push_back(l.numel);
  return n;
}

size_t total_numel(const std::vector<BlockLayout>& layouts) {
  size_t n = 0;
  for (const auto& b : layouts) n += b.numel;
  return n;
}

size_t parameter_count(const GptConfig& c) {
  const size_t C = c.n_embd;
  const size_t per_layer =
      2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  return static_cast<size_t>(c.vocab_size) * C + static_cast<size_t>(c.block_size) * C +
         c.n_layer * per_layer + 2 * C;
}

BlockSet BlockSet::zeros(const std::vector<BlockLayout>& layouts) {
  BlockSet s;
  s.blocks.reserve(layouts.size());
  for (const auto& b : layouts) s.blocks.emplace_back(b.numel);
  return s;
}

void BlockSet::zero() {
  for (auto& b : blocks) b.zero();
}

void BlockSet::copy_from(const BlockSet& o) {
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i].copy_from(o.blocks[i]);
}

size_t BlockSet::numel() const {
  size_t n = 0;
  for (const auto& b : blocks) n += b.size();
  return n;
}

GptViews::GptViews(const GptConfig& c, const std::vector<BlockLayout>& layouts, BlockSet& set) {
  auto at = [&](size_t block, const char* name) {
    return set.blocks[block].data() + layouts[block].slot(name).offset;
  };
  embedding = {at(0, "wte.weight"), at(0, "wpe.weight")};
  for (int l = 0; l < c.n_layer; ++l) {
    const size_t b = 1 + l;
    layers.push_back({at(b, "ln_1.weight"), at(b, "ln_1.bias"), at(b, "attn.c_attn.weight"),
                      at(b, "attn.c_attn.bias"), at(b, "attn.c_proj.weight"),
                      at(b, "attn.c_proj.bias"), at(b, "ln_2.weight"), at(b, "ln_2.bias"),
                      at(b, "mlp.c_fc.weight"), at(b, "mlp.c_fc.bias"), at(b, "mlp.c_proj.weight"),
                      at(b, "mlp.c_proj.bias")});
  }
  const size_t f = 1 + c.n_layer;
  final_norm = {at(f, "ln_f.weight"), at(f, "ln_f.bias")};
}

GptWeightInit::GptWeightInit(const GptConfig& c, const std::vector<BlockLayout>& layouts,
                             uint64_t seed)
    : config_(c), layouts_(layouts), rng_(seed) {}

void GptWeightInit::block(size_t bi, float* base) {
  if (bi != next_ || bi >= layouts_.size())
    throw std::logic_error(
        fmt::format("GptWeightInit: block {} asked for, block {} is next", bi, next_));
  ++next_;
  const double residual_std = 0.02 / std::sqrt(2.0 * config_.n_layer);
  for (const auto& t : layouts_[bi].tensors) {
    float* p = base + t.offset;
    const bool is_norm = t.name.rfind("ln_", 0) == 0;
    const bool is_bias = t.name.ends_with(".bias");
    if (is_norm && !is_bias) {
      for (size_t i = 0; i < t.numel; ++i) p[i] = 1.0f;
    } else if (is_bias) {
      for (size_t i = 0; i < t.numel; ++i) p[i] = 0.0f;
    } else {
      const bool residual_proj = t.name == "attn.c_proj.weight" || t.name == "mlp.c_proj.weight";
      const double std = residual_proj ? residual_std : 0.02;
      size_t n = t.numel;
      if (t.name == "wte.weight") n = static_cast<size_t>(config_.vocab_size) * config_.n_embd;
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(rng_.normal() * std);
    }
  }
}

void init_gpt_weights(const GptConfig& c, const std::vector<BlockLayout>& layouts, BlockSet& params,
                      uint64_t seed) {
  GptWeightInit init(c, layouts, seed);
  for (size_t bi = 0; bi < layouts.size(); ++bi) init.block(bi, params.blocks[bi].data());
}

}  // namespace dsactor::trainer
