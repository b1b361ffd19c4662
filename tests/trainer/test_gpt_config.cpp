#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "trainer/model/gpt_config.h"
#include "trainer/model/param_blocks.h"

namespace dsactor::trainer {
namespace {

namespace fs = std::filesystem;

TEST(GptConfig, PresetsHaveGpt2Shapes) {
  const GptConfig g = resolve_model("gpt2");
  EXPECT_EQ(g, (GptConfig{12, 12, 768, 50257, 1024}));
  EXPECT_EQ(g.padded_vocab(), 50304);
  // 124M: the published GPT-2 small parameter count (tied head).
  EXPECT_EQ(parameter_count(g), 124439808u);
  EXPECT_EQ(resolve_model("gpt2-xl"), (GptConfig{48, 25, 1600, 50257, 1024}));
  EXPECT_EQ(resolve_model("tiny").vocab_size, 256);
}

TEST(GptConfig, BlocksAreCacheLineAlignedAndCoverEveryParameter) {
  const GptConfig c{3, 4, 48, 100, 20};
  const auto layouts = gpt_block_layouts(c);
  ASSERT_EQ(layouts.size(), 5u);  // embedding, 3 layers, final norm
  size_t real = 0;
  for (const auto& b : layouts) {
    EXPECT_EQ(b.numel % 16, 0u) << b.name;
    for (const auto& t : b.tensors) {
      EXPECT_EQ(t.offset % 16, 0u) << b.name << "." << t.name;
      EXPECT_LE(t.offset + t.numel, b.numel);
      real += t.numel;
    }
  }
  // Only wte's padded rows (Vp - V) are extra.
  EXPECT_EQ(real, parameter_count(c) + static_cast<size_t>(c.padded_vocab() - c.vocab_size) * c.n_embd);
  BlockSet s = BlockSet::zeros(layouts);
  for (const auto& b : s.blocks) EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
}

TEST(GptConfig, YamlModelFileAndItsErrors) {
  const fs::path dir = fs::temp_directory_path() / ("dsactor_model_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const auto ok = write("ok.yaml", "n_layer: 3\nn_head: 2\nn_embd: 16\nvocab_size: 256\nblock_size: 32\n");
  EXPECT_EQ(resolve_model(ok), (GptConfig{3, 2, 16, 256, 32}));
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    const auto f = write("bad.yaml", text);
    try {
      resolve_model(f);
      ADD_FAILURE() << "expected error with " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.yaml"), std::string::npos) << e.what();
    }
  };
  expect_error("n_layer: 3\nn_head: 3\nn_embd: 16\nvocab_size: 256\nblock_size: 32\n", "multiple of n_head");
  expect_error("n_layer: 3\nn_head: 2\nn_embd: 16\nvocab_size: 256\n", "missing model key 'block_size'");
  expect_error("n_layers: 3\nn_head: 2\nn_embd: 16\nvocab_size: 256\nblock_size: 32\n", "unknown model key 'n_layers'");
  expect_error("n_layer: three\nn_head: 2\nn_embd: 16\nvocab_size: 256\nblock_size: 32\n", "must be an integer");
  expect_error("n_layer: 3\nn_head: 2\nn_embd: 16\nvocab_size: 70000\nblock_size: 32\n", "vocab_size");
  try {
    resolve_model("gpt3");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("gpt2-medium"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dsactor::trainer
