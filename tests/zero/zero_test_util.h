#pragma once
// What the ZeRO tests share: the corpus, runs of the stage-0 Engine and of the ZeroEngine
// recorded step by step, bit-for-bit comparison (with and without offload services); for
// ZeRO without services (the ranks hold the partitions), a ds_config of any stage and
// precision and W ranks as threads of this process with the two Gloo communicators a
// trainer process opens.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "actors/collectives/collectives.h"
#include "actors/collectives/rendezvous_store.h"
#include "tests/collectives/collectives_test_util.h"
#include "trainer/data/batch_loader.h"
#include "trainer/engine/engine.h"
#include "trainer/rng.h"
#include "trainer/zero/zero_engine.h"

namespace dsactor::trainer::test {

inline std::vector<int32_t> corpus(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i)
    t[i] = static_cast<int32_t>((i * 7 + (i / 5) % 3) % 64 ^ (rng.next_u64() % 16 == 0 ? 1 : 0));
  return t;
}

// Stage `stage` with no offload section: the ranks hold the partitions. fp16 starts at
// 2^24, so the first steps overflow and are skipped.
inline DsConfig local_config(const std::string& mode, int stage, int micro_batch = 4,
                             int world_size = 1, nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", micro_batch},
      {"gradient_accumulation_steps", 2},
      {"gradient_clipping", 1.0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
      {"scheduler",
       {{"type", "WarmupCosineLR"},
        {"params", {{"total_num_steps", 30}, {"warmup_num_steps", 5}}}}},
      {"zero_optimization", {{"stage", stage}}}};
  if (mode == "fp16")
    j["fp16"] = {{"enabled", true}, {"initial_scale_power", 24}, {"loss_scale_window", 4}};
  if (mode == "bf16") j["bf16"] = {{"enabled", true}};
  j.merge_patch(extra);
  return parse_ds_config(j, "test", world_size);
}

struct Trace {
  std::vector<StepResult> steps;
  BlockSet params;
};

// `steps` more steps of `e` from `loader`, then its weights as forward reads them.
template <class EngineT>
void continue_run(EngineT& e, BatchLoader& loader, int steps, Trace& t) {
  for (int i = 0; i < steps; ++i) t.steps.push_back(e.train_step(loader));
}

inline Trace run_stage0(const GptConfig& model, const DsConfig& c,
                        const std::vector<int32_t>& tokens, int steps) {
  Engine e(model, c, 5);
  BatchLoader loader(&tokens, static_cast<int>(c.train_micro_batch_size_per_gpu), 16, true, 9);
  Trace r;
  continue_run(e, loader, steps, r);
  r.params = BlockSet::zeros(e.model().layouts());
  r.params.copy_from(e.compute_params());
  return r;
}

inline Trace run_local(const GptConfig& model, const DsConfig& c,
                       const std::vector<int32_t>& tokens, int steps, ZeroStats* stats = nullptr) {
  ZeroEngine e(model, c, 5, ZeroOptions{});
  BatchLoader loader(&tokens, static_cast<int>(c.train_micro_batch_size_per_gpu), 16, true, 9);
  Trace r;
  continue_run(e, loader, steps, r);
  r.params = e.gather_params();
  if (stats) *stats = e.stats();
  return r;
}

inline bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, 4) == 0;
}

inline void expect_same_params(const BlockSet& want, const BlockSet& got) {
  ASSERT_EQ(want.blocks.size(), got.blocks.size());
  for (size_t b = 0; b < want.blocks.size(); ++b) {
    ASSERT_EQ(want.blocks[b].size(), got.blocks[b].size()) << "block " << b;
    EXPECT_EQ(std::memcmp(want.blocks[b].data(), got.blocks[b].data(), want.blocks[b].bytes()), 0)
        << "block " << b;
  }
}

// Losses, verdicts, loss scales, lrs, norms and final weights, bit for bit.
inline void expect_equal_runs(const Trace& want, const Trace& got) {
  ASSERT_EQ(want.steps.size(), got.steps.size());
  for (size_t i = 0; i < want.steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_TRUE(same_bits(want.steps[i].loss, got.steps[i].loss))
        << want.steps[i].loss << " vs " << got.steps[i].loss;
    EXPECT_EQ(want.steps[i].skipped, got.steps[i].skipped);
    EXPECT_EQ(want.steps[i].loss_scale, got.steps[i].loss_scale);
    EXPECT_EQ(want.steps[i].lr, got.steps[i].lr);
    if (!want.steps[i].skipped) {
      EXPECT_EQ(want.steps[i].grad_norm, got.steps[i].grad_norm);
    }
  }
  expect_same_params(want.params, got.params);
}

// One rank's communicators, as `dsactor start --role trainer` opens them: the gradients'
// and (stage 3) the parameters' allgathers on a second one.
struct RankComms {
  actors::Collectives& grad;
  actors::Collectives& param;
  ZeroOptions options(int rank, int world) const {
    ZeroOptions o;
    o.rank = static_cast<uint32_t>(rank);
    o.world_size = static_cast<uint32_t>(world);
    o.grad_comm = &grad;
    o.param_comm = &param;
    return o;
  }
};

// Runs fn(rank, comms) for `world` ranks, each on a thread of its own with its own
// rendezvous client (of one keyed store) and Gloo meshes on 127.0.0.1; rethrows the first
// rank's error.
inline void run_ranks(int world, const std::function<void(int, const RankComms&)>& fn) {
  static actors::testing::TestStore server;
  static int worlds = 0;
  const std::string job = "zero-local-" + std::to_string(worlds++);
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < world; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      actors::GlooCollectivesOptions o;
      o.timeout = std::chrono::seconds(120);
      const auto store = server.client(job, o.timeout);
      o.prefix = "grad";
      actors::GlooCollectives grad(r, world, *store, o);
      o.prefix = "param";
      actors::GlooCollectives param(r, world, *store, o);
      fn(r, RankComms{grad, param});
    }));
  for (auto& f : ranks) f.get();
}

}  // namespace dsactor::trainer::test
