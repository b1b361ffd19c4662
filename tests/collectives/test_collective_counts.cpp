// Every collective a trainer runs is counted by its communicator (Collectives' public calls,
// whatever the backend) and published per communicator and operation
// (trainer/monitor/collective_metrics.h): two Gloo ranks run known collectives and read
// exactly their payload bytes back from the registry, as /metrics serves them.
#include <gtest/gtest.h>

#include <vector>

#include "metrics/state_figures.h"
#include "tests/collectives/collectives_test_util.h"
#include "trainer/monitor/collective_metrics.h"

namespace dsactor::actors {
namespace {

using testing::fresh_job;
using testing::message;
using testing::run_world;
using testing::TestStore;

constexpr size_t kAllreduce = 1000, kReduceScatter = 300, kAllgather = 200, kBroadcast = 50;

double bytes(const nlohmann::json& state, const std::string& op) {
  return metrics::value_of(state, "dsactor_train_collective_bytes_total",
                           {{"comm", "grad"}, {"op", op}})
      .value_or(-1);
}

double ops(const nlohmann::json& state, const std::string& op) {
  return metrics::value_of(state, "dsactor_train_collective_ops_total",
                           {{"comm", "grad"}, {"op", op}})
      .value_or(-1);
}

TEST(CollectiveCounts, TwoGlooRanksReadTheirCollectivesPayloadBytesBack) {
  TestStore store;
  constexpr int W = 2;
  std::vector<nlohmann::json> states(W);
  std::vector<std::string> texts(W);
  const auto errors = run_world(store, fresh_job("counts"), W, [&](int rank, Collectives& c) {
    metrics::Registry registry;
    trainer::add_collective_metrics(registry, "grad", c.counts());
    std::vector<float> data(kAllreduce, 1.0f);
    c.allreduce_sum(data.data(), kAllreduce);
    c.allreduce_sum_async(data.data(), kAllreduce).get();
    std::vector<float> in(W * kReduceScatter, 1.0f), out(W * kAllgather);
    c.reduce_scatter_sum(in.data(), out.data(), kReduceScatter);
    c.allgather(in.data(), out.data(), kAllgather);
    c.broadcast(data.data(), kBroadcast, 1);
    c.barrier();
    states[rank] = registry.snapshot();
    texts[rank] = registry.exposition();
  });
  for (int r = 0; r < W; ++r) {
    ASSERT_EQ(message(errors[r]), "") << "rank " << r;
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto& s = states[r];
    // Each call's larger buffer (nccl-tests' size): allreduce and broadcast their data,
    // reduce-scatter its whole input, allgather its whole output.
    EXPECT_EQ(bytes(s, "allreduce"), 2 * 4 * kAllreduce);
    EXPECT_EQ(bytes(s, "reduce_scatter"), 4 * W * kReduceScatter);
    EXPECT_EQ(bytes(s, "allgather"), 4 * W * kAllgather);
    EXPECT_EQ(bytes(s, "broadcast"), 4 * kBroadcast);
    EXPECT_EQ(ops(s, "allreduce"), 2);
    for (const char* op : {"reduce_scatter", "allgather", "broadcast", "barrier"})
      EXPECT_EQ(ops(s, op), 1) << op;
    EXPECT_FALSE(metrics::value_of(s, "dsactor_train_collective_bytes_total", {{"op", "barrier"}}))
        << "a barrier moves no payload";
    EXPECT_NE(texts[r].find("dsactor_train_collective_bytes_total{comm=\"grad\",op=\"allreduce\"} "
                            "8000\n"),
              std::string::npos)
        << texts[r];
  }
}

// World size 1: the calls are identities, and they count the same way.
TEST(CollectiveCounts, LocalCollectivesCountLikeEveryBackend) {
  LocalCollectives c;
  std::vector<float> data(64), out(64);
  c.allreduce_sum(data.data(), 64);
  c.allgather(data.data(), out.data(), 16);
  const auto counts = c.counts();
  EXPECT_EQ(counts->of(CollectiveOp::kAllreduce).bytes, 256u);
  EXPECT_EQ(counts->of(CollectiveOp::kAllreduce).ops, 1u);
  EXPECT_EQ(counts->of(CollectiveOp::kAllgather).bytes, 64u);
  EXPECT_EQ(counts->of(CollectiveOp::kReduceScatter).ops, 0u);
}

}  // namespace
}  // namespace dsactor::actors
