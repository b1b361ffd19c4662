// The whole model's backward against central finite differences of its own forward loss,
// and the determinism every other mode is compared under.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "trainer/model/gpt.h"
#include "trainer/rng.h"

namespace dsactor::trainer {
namespace {

GptConfig tiny() { return {2, 2, 16, 40, 8}; }

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch random_batch(const GptConfig& c, int B, int T, uint64_t seed) {
  Rng rng(seed);
  Batch b{std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
  for (auto& t : b.inputs) t = static_cast<int32_t>(rng.next_u64() % c.vocab_size);
  for (auto& t : b.targets) t = static_cast<int32_t>(rng.next_u64() % c.vocab_size);
  return b;
}

TEST(GptModel, BackwardMatchesFiniteDifferencesInEveryBlock) {
  const GptConfig c = tiny();
  const int B = 2, T = 5;
  GptModel model(c);
  BlockSet params = BlockSet::zeros(model.layouts());
  // Larger init than GPT-2's 0.02 so every path carries gradient well above float noise.
  init_gpt_weights(c, model.layouts(), params, 7);
  for (auto& blk : params.blocks)
    for (size_t i = 0; i < blk.size(); ++i) blk[i] *= 5.0f;
  BlockSet grads = BlockSet::zeros(model.layouts());
  const Batch batch = random_batch(c, B, T, 3);
  model.forward_backward(params, grads, batch.inputs.data(), batch.targets.data(), B, T, 1.0f / (B * T));

  Rng pick(11);
  int checked = 0;
  for (size_t b = 0; b < model.layouts().size(); ++b) {
    for (const auto& slot : model.layouts()[b].tensors) {
      size_t n = slot.numel;
      if (slot.name == "wte.weight") n = static_cast<size_t>(c.vocab_size) * c.n_embd;
      if (slot.name == "wpe.weight") n = static_cast<size_t>(T) * c.n_embd;  // rows used
      for (int k = 0; k < 3; ++k) {
        const size_t i = slot.offset + pick.next_u64() % n;
        float& p = params.blocks[b][i];
        const float saved = p;
        const float eps = 1e-2f;
        p = saved + eps;
        const double up = model.forward_loss(params, batch.inputs.data(), batch.targets.data(), B, T);
        p = saved - eps;
        const double down = model.forward_loss(params, batch.inputs.data(), batch.targets.data(), B, T);
        p = saved;
        const double fd = (up - down) / (2.0 * eps);
        const double analytic = grads.blocks[b][i];
        EXPECT_NEAR(analytic, fd, 2e-3 + 0.05 * std::abs(fd))
            << model.layouts()[b].name << "." << slot.name << " element " << i - slot.offset;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 3 * (2 + 12 * c.n_layer + 2));
}

TEST(GptModel, PaddedVocabularyGetsNoGradient) {
  const GptConfig c = tiny();  // vocab 40 padded to 64
  ASSERT_EQ(c.padded_vocab(), 64);
  GptModel model(c);
  BlockSet params = BlockSet::zeros(model.layouts());
  init_gpt_weights(c, model.layouts(), params, 1);
  BlockSet grads = BlockSet::zeros(model.layouts());
  const Batch batch = random_batch(c, 2, 8, 5);
  model.forward_backward(params, grads, batch.inputs.data(), batch.targets.data(), 2, 8, 1.0f / 16);
  const float* dwte = grads.blocks[0].data();
  for (size_t i = static_cast<size_t>(c.vocab_size) * c.n_embd;
       i < static_cast<size_t>(c.padded_vocab()) * c.n_embd; ++i)
    ASSERT_EQ(dwte[i], 0.0f) << "padded row element " << i;
  for (size_t i = 0; i < static_cast<size_t>(c.vocab_size) * c.n_embd; ++i)
    if (dwte[i] != 0.0f) return;
  FAIL() << "no gradient reached the real vocabulary rows";
}

TEST(GptModel, LossAtInitIsNearUniform) {
  const GptConfig c = tiny();
  GptModel model(c);
  BlockSet params = BlockSet::zeros(model.layouts());
  init_gpt_weights(c, model.layouts(), params, 1);
  const Batch batch = random_batch(c, 2, 8, 9);
  const float loss = model.forward_loss(params, batch.inputs.data(), batch.targets.data(), 2, 8);
  EXPECT_NEAR(loss, std::log(static_cast<float>(c.vocab_size)), 0.1);
}

TEST(GptModel, SameInputsAndThreadsGiveIdenticalBits) {
  const GptConfig c{2, 4, 64, 256, 32};
  omp_set_num_threads(2);
  auto run = [&] {
    GptModel model(c);
    BlockSet params = BlockSet::zeros(model.layouts());
    init_gpt_weights(c, model.layouts(), params, 42);
    BlockSet grads = BlockSet::zeros(model.layouts());
    const Batch batch = random_batch(c, 4, 32, 8);
    const float loss = model.forward_backward(params, grads, batch.inputs.data(),
                                              batch.targets.data(), 4, 32, 1.0f / 128);
    return std::make_pair(loss, std::move(grads));
  };
  auto [l1, g1] = run();
  auto [l2, g2] = run();
  EXPECT_EQ(std::memcmp(&l1, &l2, sizeof(float)), 0);
  for (size_t b = 0; b < g1.blocks.size(); ++b)
    ASSERT_EQ(std::memcmp(g1.blocks[b].data(), g2.blocks[b].data(), g1.blocks[b].bytes()), 0)
        << "block " << b;
}

TEST(GptModel, RejectsTokensOutsideTheVocabulary) {
  const GptConfig c = tiny();
  GptModel model(c);
  BlockSet params = BlockSet::zeros(model.layouts());
  std::vector<int32_t> bad{1, 2, 40, 3}, targets{1, 2, 3, 4};
  EXPECT_THROW(model.forward_loss(params, bad.data(), targets.data(), 1, 4), std::invalid_argument);
}

}  // namespace
}  // namespace dsactor::trainer
