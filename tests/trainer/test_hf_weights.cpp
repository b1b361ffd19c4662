// Weights move between dsactor and PyTorch through safetensors with Hugging Face GPT-2 names
// and layouts. The layout is checked against a file built here by hand from HF's
// conventions (Conv1D weights [in, out], wte [vocab, C]), not only against our own writer.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "storage/safetensors.h"
#include "trainer/inference.h"
#include "trainer/model/hf_weights.h"

namespace dsactor::trainer {
namespace {

namespace fs = std::filesystem;
const GptConfig kCfg{2, 2, 8, 40, 6};

fs::path temp(const std::string& name) {
  return fs::temp_directory_path() / ("dsactor_hf_" + std::to_string(::getpid()) + "_" + name);
}

storage::TensorData f32(std::vector<int64_t> shape, float base) {
  storage::TensorData d{"F32", shape, {}};
  const size_t n = storage::shape_elements(shape);
  d.bytes.resize(n * 4);
  auto* p = reinterpret_cast<float*>(d.bytes.data());
  for (size_t i = 0; i < n; ++i) p[i] = base + 0.001f * static_cast<float>(i);
  return d;
}

TEST(HfWeights, ExportImportRoundTripIsExactAndSelfDescribing) {
  const auto layouts = gpt_block_layouts(kCfg);
  BlockSet a = BlockSet::zeros(layouts);
  init_gpt_weights(kCfg, layouts, a, 3);
  const auto file = temp("rt.safetensors");
  export_hf_safetensors(file, kCfg, a);
  EXPECT_EQ(hf_safetensors_config(file), kCfg);
  const auto loaded = load_safetensors_weights(file);
  ASSERT_EQ(loaded.config, kCfg);
  for (size_t b = 0; b < layouts.size(); ++b)
    EXPECT_EQ(std::memcmp(a.blocks[b].data(), loaded.params.blocks[b].data(), a.blocks[b].bytes()), 0)
        << layouts[b].name;
  const auto f = storage::read_safetensors(file);
  EXPECT_EQ(f.tensors.at("wte.weight").shape, (std::vector<int64_t>{40, 8}));  // real vocab only
  EXPECT_EQ(f.tensors.at("h.1.attn.c_attn.weight").shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(f.tensors.at("h.0.mlp.c_proj.weight").shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(f.tensors.count("ln_f.bias"), 1u);
  EXPECT_EQ(f.tensors.size(), 2u + 12u * 2u + 2u);
  fs::remove(file);
}

TEST(HfWeights, ImportsHuggingFaceLayoutTransposingConv1D) {
  // A file as PyTorch's GPT2LMHeadModel.save_pretrained writes it (prefix, buffers, tied head).
  std::map<std::string, storage::TensorData> t;
  const int C = kCfg.n_embd;
  t["transformer.wte.weight"] = f32({40, C}, 1.0f);
  t["transformer.wpe.weight"] = f32({6, C}, 2.0f);
  t["lm_head.weight"] = f32({40, C}, 9.0f);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    t[p + "ln_1.weight"] = f32({C}, 3.0f);
    t[p + "ln_1.bias"] = f32({C}, 3.5f);
    t[p + "attn.bias"] = f32({1, 1, 6, 6}, 0.0f);  // causal mask buffer
    t[p + "attn.c_attn.weight"] = f32({C, 3 * C}, 4.0f);
    t[p + "attn.c_attn.bias"] = f32({3 * C}, 4.5f);
    t[p + "attn.c_proj.weight"] = f32({C, C}, 5.0f);
    t[p + "attn.c_proj.bias"] = f32({C}, 5.5f);
    t[p + "ln_2.weight"] = f32({C}, 6.0f);
    t[p + "ln_2.bias"] = f32({C}, 6.5f);
    t[p + "mlp.c_fc.weight"] = f32({C, 4 * C}, 7.0f);
    t[p + "mlp.c_fc.bias"] = f32({4 * C}, 7.5f);
    t[p + "mlp.c_proj.weight"] = f32({4 * C, C}, 8.0f);
    t[p + "mlp.c_proj.bias"] = f32({C}, 8.5f);
  }
  t["transformer.ln_f.weight"] = f32({C}, 10.0f);
  t["transformer.ln_f.bias"] = f32({C}, 11.0f);
  const auto file = temp("hf.safetensors");
  storage::write_safetensors(file, t);

  const auto layouts = gpt_block_layouts(kCfg);
  BlockSet p = BlockSet::zeros(layouts);
  import_hf_safetensors(file, kCfg, p);
  GptViews v(kCfg, layouts, p);
  // HF c_attn.weight[i][o] (i in C, o in 3C) is dsactor's qkvw[o][i].
  for (int i = 0; i < C; ++i)
    for (int o = 0; o < 3 * C; ++o)
      ASSERT_FLOAT_EQ(v.layers[1].qkvw[o * C + i], 4.0f + 0.001f * (i * 3 * C + o));
  for (int i = 0; i < 4 * C; ++i)
    for (int o = 0; o < C; ++o)
      ASSERT_FLOAT_EQ(v.layers[0].fcprojw[o * 4 * C + i], 8.0f + 0.001f * (i * C + o));
  EXPECT_FLOAT_EQ(v.embedding.wte[39 * C + 7], 1.0f + 0.001f * (39 * C + 7));
  EXPECT_EQ(v.embedding.wte[40 * C], 0.0f);  // padding row stays zero
  EXPECT_FLOAT_EQ(v.final_norm.lnfb[3], 11.003f);
  fs::remove(file);
}

TEST(HfWeights, MissingUnknownOrMisshapenTensorsAreNamedAndLeaveParamsUntouched) {
  const auto layouts = gpt_block_layouts(kCfg);
  BlockSet src = BlockSet::zeros(layouts);
  init_gpt_weights(kCfg, layouts, src, 1);
  const auto file = temp("bad.safetensors");
  export_hf_safetensors(file, kCfg, src);
  auto f = storage::read_safetensors(file);

  BlockSet dst = BlockSet::zeros(layouts);
  auto expect_error = [&](const std::map<std::string, storage::TensorData>& tensors, const std::string& needle) {
    storage::write_safetensors(file, tensors, f.metadata);
    try {
      import_hf_safetensors(file, kCfg, dst);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    for (const auto& b : dst.blocks)
      for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], 0.0f);
  };
  auto missing = f.tensors;
  missing.erase("h.1.ln_2.bias");
  expect_error(missing, "'h.1.ln_2.bias' is missing");
  auto extra = f.tensors;
  extra["h.7.ln_1.weight"] = f32({8}, 0);
  expect_error(extra, "unexpected tensor 'h.7.ln_1.weight'");
  auto shaped = f.tensors;
  shaped["h.0.attn.c_attn.weight"] = f32({24, 8}, 0);
  expect_error(shaped, "'h.0.attn.c_attn.weight' has shape [24, 8], expected [8, 24]");
  fs::remove(file);
}

}  // namespace
}  // namespace dsactor::trainer
