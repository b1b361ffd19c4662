// The optimizer a ds_config names, in the stage-0 engine: Lamb's trust ratio per parameter
// tensor, OneCycle's betas reaching Adam, a Lamb run that learns, and what offload services
// refuse to run.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>

#include "kernels/cpu/lamb.h"
#include "tests/trainer/block_set_test_util.h"
#include "trainer/config/lr_schedule.h"
#include "trainer/data/batch_loader.h"
#include "trainer/engine/engine.h"
#include "trainer/optimizer_step.h"
#include "trainer/rng.h"
#include "trainer/run_plan.h"

namespace dsactor::trainer {
namespace {

namespace k = dsactor::kernels::cpu;

const GptConfig kTiny{2, 2, 32, 64, 16};

DsConfig config(const char* optimizer, nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 4},
      {"optimizer", {{"type", optimizer}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}}};
  j.merge_patch(extra);
  return parse_ds_config(j, "test");
}

BlockSet random_set(const std::vector<BlockLayout>& layouts, uint64_t seed, float scale) {
  BlockSet s = BlockSet::zeros(layouts);
  Rng rng(seed);
  for (auto& b : s.blocks)
    for (size_t i = 0; i < b.size(); ++i)
      b.data()[i] = scale * (static_cast<float>(rng.next_u64() % 2001) / 1000.0f - 1.0f);
  return s;
}

TEST(OptimizerStep, LambStepsEachParameterTensorWithItsOwnTrustRatio) {
  const auto layouts = gpt_block_layouts(kTiny);
  const DsConfig c = config("Lamb", {{"optimizer", {{"params", {{"max_coeff", 5.0}}}}}});
  BlockSet p = random_set(layouts, 1, 1.0f), m = BlockSet::zeros(layouts),
           v = BlockSet::zeros(layouts);
  const BlockSet g = random_set(layouts, 2, 0.1f);
  BlockSet want_p = BlockSet::zeros(layouts), want_m = BlockSet::zeros(layouts),
           want_v = BlockSet::zeros(layouts);
  want_p.copy_from(p);
  const k::AdamHyper adam = adam_hyper_of(c.optimizer);
  local_optimizer_step(c, layouts, p, m, v, g, adam, 2e-3, 1, 0.5f);

  k::LambHyper h;
  h.lr = 2e-3f;
  h.weight_decay = 0.01f;
  h.max_coeff = 5.0f;
  std::vector<float> coeffs;
  for (size_t b = 0; b < layouts.size(); ++b)
    for (const TensorSlot& t : layouts[b].tensors)
      coeffs.push_back(k::lamb_step(
          want_p.blocks[b].data() + t.offset, want_m.blocks[b].data() + t.offset,
          want_v.blocks[b].data() + t.offset, g.blocks[b].data() + t.offset, t.numel, h, 1, 0.5f));
  EXPECT_TRUE(same_bits(p, want_p));
  EXPECT_TRUE(same_bits(m, want_m));
  // LayerNorm weights (ones) and the small random matrices have different ratios: one ratio
  // per block would be wrong.
  EXPECT_NE(*std::min_element(coeffs.begin(), coeffs.end()),
            *std::max_element(coeffs.begin(), coeffs.end()));
}

TEST(OptimizerStep, OneCycleMomentumSetsAdamsBetasEachStep) {
  const auto layouts = gpt_block_layouts(kTiny);
  const DsConfig c = config("Adam", {{"scheduler",
                                      {{"type", "OneCycle"},
                                       {"params",
                                        {{"cycle_min_lr", 1e-4},
                                         {"cycle_max_lr", 1e-3},
                                         {"cycle_first_step_size", 3},
                                         {"cycle_min_mom", 0.85},
                                         {"cycle_max_mom", 0.95}}}}}});
  const k::AdamHyper adam = adam_hyper_of(c.optimizer);
  for (int64_t step : {1, 2, 4, 9}) {
    SCOPED_TRACE(step);
    BlockSet p = random_set(layouts, 3, 1.0f), m = random_set(layouts, 4, 0.01f),
             v = random_set(layouts, 5, 0.0f);
    const BlockSet g = random_set(layouts, 6, 0.1f);
    BlockSet want = BlockSet::zeros(layouts), wm = BlockSet::zeros(layouts),
             wv = BlockSet::zeros(layouts);
    want.copy_from(p);
    wm.copy_from(m);
    wv.copy_from(v);
    const double lr = learning_rate(c.scheduler, adam.lr, step - 1);
    local_optimizer_step(c, layouts, p, m, v, g, adam, lr, step, 1.0f);
    k::AdamHyper h = adam;
    h.lr = static_cast<float>(lr);
    const auto betas = scheduled_betas(c.scheduler, {0.9, 0.999}, step - 1);
    h.beta1 = static_cast<float>(betas[0]);
    h.beta2 = 0.99f;
    EXPECT_NE(h.beta1, adam.beta1);
    for (size_t b = 0; b < layouts.size(); ++b)
      k::adam_step(want.blocks[b].data(), wm.blocks[b].data(), wv.blocks[b].data(),
                   g.blocks[b].data(), want.blocks[b].size(), h, step, 1.0f);
    EXPECT_TRUE(same_bits(p, want));
  }
}

TEST(OptimizerStep, TheStage0EngineLearnsWithLamb) {
  omp_set_num_threads(2);
  Rng rng(6);
  std::vector<int32_t> tokens(8000);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>((i * 7 + (i / 5) % 3) % 64 ^ (rng.next_u64() % 16 == 0));
  // A Lamb step moves each tensor by step_size * ||w||, and step_size carries
  // sqrt(1 - beta2^t) / (1 - beta1^t), about 0.03 lr at first: Lamb starts slowly, so it
  // gets more steps than Adam's test and a larger lr.
  Engine e(kTiny, config("Lamb", {{"optimizer", {{"params", {{"lr", 0.1}}}}}}), 1);
  BatchLoader loader(&tokens, 4, 16, true, 1);
  const float first = e.train_step(loader).loss;
  float last = first;
  for (int i = 0; i < 80; ++i) last = e.train_step(loader).loss;
  EXPECT_LT(last, first - 1.0f) << first << " -> " << last;
}

TEST(OptimizerStep, PartitionedStagesRefuseLambAndOneCycleMomentum) {
  try {
    check_partitioned_optimizer(config("Lamb"));
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.type: Lamb"), std::string::npos) << e.what();
  }
  const auto one_cycle = [](bool momentum) {
    return config(
        "AdamW",
        {{"scheduler",
          {{"type", "OneCycle"},
           {"params",
            {{"cycle_min_lr", 1e-4}, {"cycle_max_lr", 1e-3}, {"cycle_momentum", momentum}}}}}});
  };
  EXPECT_THROW(check_partitioned_optimizer(one_cycle(true)), ConfigError);
  EXPECT_NO_THROW(check_partitioned_optimizer(one_cycle(false)));
  EXPECT_NO_THROW(check_partitioned_optimizer(config("AdamW")));
  // The engine choice of stages 1-3 asks, with the ranks holding the partitions too.
  const auto stage = [](const char* type, int s) {
    return config(type, {{"zero_optimization", {{"stage", s}}}});
  };
  EXPECT_THROW(choose_engine(stage("Lamb", 2), 0), ConfigError);
  EXPECT_EQ(choose_engine(stage("Lamb", 0), 0), EngineChoice::kStage0);
  EXPECT_EQ(choose_engine(stage("AdamW", 2), 0), EngineChoice::kZeroOnRanks);
}

}  // namespace
}  // namespace dsactor::trainer
