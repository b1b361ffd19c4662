#include "bench/dp_bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <omp.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>

#include "actors/collectives/collectives.h"
#include "actors/collectives/job_token.h"
#include "actors/collectives/rendezvous_store.h"
#include "bench/rank_world.h"
#include "security/curve_keys.h"
#include "trainer/config/ds_config.h"
#include "trainer/data/batch_loader.h"
#include "trainer/engine/engine.h"
#include "trainer/model/gpt_config.h"

namespace dsactor::bench {

namespace {

using Clock = std::chrono::steady_clock;
using GlooContext = std::shared_ptr<gloo::Context>;

struct Op {
  std::string op;
  std::string impl;
  double bus_factor;
};

// Per-rank buffers, allocated once and shared by every measurement.
struct RankBuffers {
  std::vector<float> data, part, gathered;
};

// Each op's time per call (the slowest rank's) and its algorithm and bus bandwidth.
nlohmann::json timed_ops(const std::vector<Op>& ops,
                         const std::vector<std::vector<double>>& seconds, size_t used_bytes,
                         int iters) {
  nlohmann::json results = nlohmann::json::array();
  for (size_t i = 0; i < ops.size(); ++i) {
    const double t = *std::max_element(seconds[i].begin(), seconds[i].end()) / iters;
    const double algbw = static_cast<double>(used_bytes) / t / 1e9;
    results.push_back({{"op", ops[i].op},
                       {"impl", ops[i].impl},
                       {"seconds_per_call", t},
                       {"algbw_gbps", algbw},
                       {"busbw_gbps", algbw * ops[i].bus_factor}});
  }
  return results;
}

}  // namespace

nlohmann::json run_dp_bench(int world_size, size_t bytes, int iters) {
  if (world_size < 2) throw std::invalid_argument("dp bench: world size must be >= 2");
  if (iters < 1) throw std::invalid_argument("dp bench: iters must be >= 1");
  const size_t W = static_cast<size_t>(world_size);
  const size_t per = bytes / sizeof(float) / W;
  if (per == 0) throw std::invalid_argument("dp bench: bytes must be >= 4 * world size");
  const size_t count = per * W;
  const size_t used_bytes = count * sizeof(float);

  const double w = static_cast<double>(W);
  const std::vector<Op> ops{
      {"allreduce", "dsactor", 2 * (w - 1) / w},  {"allreduce", "gloo", 2 * (w - 1) / w},
      {"reduce_scatter", "dsactor", (w - 1) / w}, {"reduce_scatter", "gloo", (w - 1) / w},
      {"allgather", "dsactor", (w - 1) / w},      {"allgather", "gloo", (w - 1) / w}};
  // seconds[op][rank]: each rank's time for `iters` calls.
  std::vector<std::vector<double>> seconds(ops.size(), std::vector<double>(W, 0.0));

  // The ranks are threads of this process: one in-memory keypair for the store and them.
  const auto keys = actors::shared_key_security(security::generate_keypair());
  const std::string token = actors::generate_job_token();
  actors::RendezvousServer server("tcp://127.0.0.1:*", keys.server);
  actors::GlooCollectivesOptions options;
  options.timeout = std::chrono::seconds(120);

  auto rank_main = [&](int rank) {
    actors::RendezvousClient client(server.endpoint(), "dp-bench", keys.client, token,
                                    options.timeout);
    actors::GlooCollectives coll(rank, world_size, client, options);
    // Zeros: sums stay finite however many iterations run (no inf/NaN slow paths).
    RankBuffers b{std::vector<float>(count, 0.f), std::vector<float>(per, 0.f),
                  std::vector<float>(count, 0.f)};

    auto gloo_on_comm = [&](std::function<void(const GlooContext&)> fn) {
      coll.run_on_comm_thread(std::move(fn)).get();
    };
    // Gloo's own algorithms; each call builds its options like a plain user of Gloo would.
    auto gloo_allreduce = [&](const GlooContext& ctx) {
      gloo::AllreduceOptions o(ctx);
      o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      o.setOutput(b.data.data(), count);
      o.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      gloo::allreduce(o);
    };
    auto gloo_allgather = [&](const GlooContext& ctx) {
      gloo::AllgatherOptions o(ctx);
      o.setInput(b.part.data(), per);
      o.setOutput(b.gathered.data(), count);
      gloo::allgather(o);
    };

    auto measure = [&](size_t which, const std::function<void()>& one) {
      one();  // warm-up
      coll.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) one();
      seconds[which][rank] = std::chrono::duration<double>(Clock::now() - t0).count();
    };

    measure(0, [&] { coll.allreduce_sum(b.data.data(), count); });
    measure(1, [&] { gloo_on_comm(gloo_allreduce); });
    measure(2, [&] { coll.reduce_scatter_sum(b.data.data(), b.part.data(), per); });
    {
      // Gloo's reduce-scatter is an Algorithm object set up once (it registers buffers
      // with every pair) and run in place on the input.
      std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs;
      gloo_on_comm([&](const GlooContext& ctx) {
        rs = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
            ctx, std::vector<float*>{b.data.data()}, static_cast<int>(count),
            std::vector<int>(W, static_cast<int>(per)));
      });
      measure(3, [&] { gloo_on_comm([&](const GlooContext&) { rs->run(); }); });
      gloo_on_comm([&](const GlooContext&) { rs.reset(); });
    }
    measure(4, [&] { coll.allgather(b.part.data(), b.gathered.data(), per); });
    measure(5, [&] { gloo_on_comm(gloo_allgather); });
    coll.barrier();
  };

  std::vector<std::future<void>> ranks;
  for (int r = 0; r < world_size; ++r)
    ranks.push_back(std::async(std::launch::async, rank_main, r));
  for (auto& f : ranks) f.get();

  const nlohmann::json results = timed_ops(ops, seconds, used_bytes, iters);
  nlohmann::json ratios;
  for (size_t i = 0; i + 1 < ops.size(); i += 2) {
    ratios[ops[i].op] = results[i + 1]["seconds_per_call"].get<double>() /
                        results[i]["seconds_per_call"].get<double>();
  }
  return {{"world_size", world_size}, {"bytes", used_bytes},
          {"iters", iters},           {"transport", "gloo tcp, ranks as threads, 127.0.0.1"},
          {"results", results},       {"dsactor_speed_vs_gloo", ratios}};
}

namespace {

// One rank of the step benchmark, in its own process.
nlohmann::json step_rank(const DpStepBenchOptions& o, int rank, int world_size,
                         const RankMeeting& meeting) {
  omp_set_num_threads(1);
  const trainer::GptConfig gpt = trainer::resolve_model(o.model);
  if (o.seq > gpt.block_size)
    throw std::invalid_argument("dp bench: --seq exceeds the model's block_size");
  const nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", o.micro_batch},
                              {"gradient_accumulation_steps", 1},
                              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}}};
  const trainer::DsConfig config = trainer::parse_ds_config(cfg, "dp bench", world_size);
  const auto tokens = synthetic_tokens(
      static_cast<size_t>(o.micro_batch) * o.seq * world_size * 8 + 1, gpt.vocab_size);
  trainer::BatchLoader loader(&tokens, o.micro_batch, o.seq, false, 1, rank, world_size);
  RankWorld world = join_rank_world(rank, world_size, meeting, "dp-step-bench", false);
  trainer::Engine engine(gpt, config, 1234, world.grad.get());
  for (int i = 0; i < o.warmup_steps; ++i) engine.train_step(loader);
  if (world.grad) world.grad->barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < o.steps; ++i) engine.train_step(loader);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count() / o.steps;
  return {{"seconds_per_step", s}};
}

}  // namespace

nlohmann::json run_dp_step_bench(const DpStepBenchOptions& o) {
  if (o.steps < 1 || o.micro_batch < 1 || o.seq < 1)
    throw std::invalid_argument("dp bench: steps, micro-batch and seq must be >= 1");
  nlohmann::json phases;
  for (int world_size : {1, 2}) {
    double slowest = 0;
    for (const auto& r : run_forked_ranks("dp bench", world_size,
                                          [&o, world_size](int rank, const RankMeeting&meeting) {
                                            return step_rank(o, rank, world_size, meeting);
                                          }))
      slowest = std::max(slowest, r["seconds_per_step"].get<double>());
    const double tokens = static_cast<double>(o.micro_batch) * o.seq * world_size;
    phases[std::to_string(world_size)] = {{"seconds_per_step", slowest},
                                          {"tokens_per_second", tokens / slowest}};
  }
  const double tps1 = phases["1"]["tokens_per_second"].get<double>();
  const double tps2 = phases["2"]["tokens_per_second"].get<double>();
  return {{"model", o.model},
          {"micro_batch_per_rank", o.micro_batch},
          {"seq", o.seq},
          {"steps", o.steps},
          {"ranks", phases},
          {"step_time_ratio_2_over_1", phases["2"]["seconds_per_step"].get<double>() /
                                           phases["1"]["seconds_per_step"].get<double>()},
          {"scaling_efficiency", tps2 / (2 * tps1)},
          {"hardware_threads", std::thread::hardware_concurrency()},
          {"note",
           "stage 0, one OpenMP thread per rank, Gloo over 127.0.0.1; below 2 free "
           "cores the 2-rank run time-shares them"}};
}

}  // namespace dsactor::bench
