// NcclCollectives. Without NCCL in the build: the factory refuses with a message saying so.
// With NCCL but no CUDA device (this test's usual CPU machines): the constructor names the
// missing device, and the GPU tests skip saying why. With one device: world size 1 (identity
// reductions, gathers, broadcast, barrier) and a missing peer timing out; with two: two ranks
// in two threads through a RendezvousServer on 127.0.0.1, sums against a double reference
// (NCCL's summation order is its own, so to a relative 1e-6, not bit for bit).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "actors/collectives/collectives.h"
#include "actors/collectives/nccl_collectives.h"
#include "actors/collectives/rendezvous_store.h"
#include "tests/collectives/collectives_test_util.h"

#ifdef DSACTOR_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace dsactor::actors {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "(no CollectiveError)";
}

#ifndef DSACTOR_HAVE_NCCL

TEST(NcclCollectives, FactoryRefusesWhenNotBuiltWithNccl) {
  testing::TestStore server;
  auto store_client = server.client("nccl-test", 1s);
  RendezvousClient& store = *store_client;
  EXPECT_THAT(error_of([&] { make_nccl_collectives(0, 1, 0, store); }),
              AllOf(HasSubstr("not built with NCCL"), HasSubstr("DSACTOR_WITH_CUDA")));
}

#else

// CUDA devices this process sees; 0 when the runtime or the driver says none.
int cuda_devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

NcclCollectivesOptions quick() {
  NcclCollectivesOptions o;
  o.timeout = 20s;
  return o;
}

TEST(NcclCollectives, WithoutTheDeviceTheConstructorNamesIt) {
  const int n = cuda_devices();
  testing::TestStore server;
  auto store_client = server.client("nccl-test", 1s);
  RendezvousClient& store = *store_client;
  // Device n never exists: 0 on a machine without GPUs, one past the last otherwise.
  EXPECT_THAT(error_of([&] { make_nccl_collectives(0, 1, n, store, quick()); }),
              AllOf(HasSubstr("CUDA device " + std::to_string(n) + " is not available"),
                    HasSubstr("rank 0 of 1")));
}

std::vector<float> ramp(size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = offset + scale * static_cast<float>((i * 7919) % 1009);
  return v;
}

TEST(NcclCollectives, WorldOfOneOnDeviceZero) {
  if (cuda_devices() < 1) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or 0)";
  testing::TestStore server;
  auto store_client = server.client("nccl-w1", 10s);
  RendezvousClient& store = *store_client;
  auto c = make_nccl_collectives(0, 1, 0, store, quick());
  ASSERT_EQ(c->world_size(), 1);

  // Sizes that grow the staging buffer and one that is not a multiple of anything.
  for (size_t n : {size_t{1}, size_t{1000}, (size_t{1} << 20) + 3}) {
    SCOPED_TRACE(n);
    const auto x = ramp(n, 0.25f, -3.0f);
    auto data = x;
    c->allreduce_sum(data.data(), n);
    EXPECT_EQ(data, x);  // a sum over one rank is the value itself

    std::vector<float> out(n, -1.0f);
    c->reduce_scatter_sum(x.data(), out.data(), n);
    EXPECT_EQ(out, x);

    std::vector<float> gathered(n, -1.0f);
    c->allgather(x.data(), gathered.data(), n);
    EXPECT_EQ(gathered, x);

    auto b = x;
    c->broadcast(b.data(), n, 0);
    EXPECT_EQ(b, x);
  }
  // In place: in aliases out + rank * count.
  auto inplace = ramp(64, 1.0f, 1.0f);
  const auto before = inplace;
  c->allgather(inplace.data(), inplace.data(), inplace.size());
  EXPECT_EQ(inplace, before);
  c->barrier();
  auto f = c->allreduce_sum_async(inplace.data(), inplace.size());
  f.get();
  EXPECT_THAT(error_of([&] { c->broadcast(inplace.data(), 4, 1); }),
              HasSubstr("root 1 is not in [0, 1)"));
  // A failed call leaves the object unusable, and says why.
  EXPECT_THAT(error_of([&] { c->barrier(); }), HasSubstr("unusable after an earlier failure"));
}

TEST(NcclCollectives, MissingPeerTimesOutNamingTheJoin) {
  if (cuda_devices() < 1) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or 0)";
  testing::TestStore server;
  auto store_client = server.client("nccl-missing", 10s);
  RendezvousClient& store = *store_client;
  NcclCollectivesOptions o;
  o.timeout = 3s;
  EXPECT_THAT(error_of([&] { make_nccl_collectives(0, 2, 0, store, o); }),
              AllOf(HasSubstr("join on rank 0 of 2"), HasSubstr("3000 ms timeout")));
  // Rank 1 of that world finds the id rank 0 published (the store's broadcast).
  auto peer = server.client("nccl-missing", 1s);
  EXPECT_EQ(peer->get("nccl/unique_id").size(), 128u);
}

TEST(NcclCollectives, TwoRanksOnTwoDevicesSumLikeADoubleReference) {
  if (cuda_devices() < 2)
    GTEST_SKIP() << "needs 2 CUDA devices, found " << cuda_devices()
                 << " (NCCL runs one rank per device)";
  constexpr int kWorld = 2;
  constexpr size_t kCount = 100003;  // per rank in reduce-scatter / allgather
  testing::TestStore server;
  std::vector<std::vector<float> > in(kWorld), allreduced(kWorld), scattered(kWorld),
      gathered(kWorld), broadcast(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    in[r] = ramp(kWorld * kCount, 0.001f * (r + 1), 0.5f + r);
    ranks.emplace_back([&, r] {
      try {
        auto store_client = server.client("nccl-w2", 30s);
        RendezvousClient& store = *store_client;
        auto c = make_nccl_collectives(r, kWorld, r, store, quick());
        allreduced[r] = in[r];
        c->allreduce_sum(allreduced[r].data(), allreduced[r].size());
        scattered[r].assign(kCount, 0.0f);
        c->reduce_scatter_sum(in[r].data(), scattered[r].data(), kCount);
        gathered[r].assign(kWorld * kCount, 0.0f);
        c->allgather(in[r].data(), gathered[r].data(), kCount);
        broadcast[r] = r == 1 ? in[r] : std::vector<float>(kWorld * kCount, 0.0f);
        c->broadcast(broadcast[r].data(), broadcast[r].size(), 1);
        c->barrier();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  auto near = [](float got, double want) {
    return std::abs(static_cast<double>(got) - want) <= 1e-6 * std::max(1.0, std::abs(want));
  };
  for (int r = 0; r < kWorld; ++r) {
    size_t bad = 0;
    for (size_t i = 0; i < kWorld * kCount; ++i) {
      double sum = 0;
      for (int q = 0; q < kWorld; ++q) sum += in[q][i];
      bad += !near(allreduced[r][i], sum);
      // rank r's reduce-scatter slice is the sum of every rank's slice r
      if (i >= r * kCount && i < (r + 1) * kCount) bad += !near(scattered[r][i - r * kCount], sum);
      // allgather: rank q's first kCount inputs at offset q * kCount; broadcast: rank 1's
      bad += gathered[r][i] != in[i / kCount][i % kCount];
      bad += broadcast[r][i] != in[1][i];
    }
    EXPECT_EQ(bad, 0u) << "rank " << r;
  }
  EXPECT_EQ(allreduced[0], allreduced[1]);  // the same bits on every rank of one run
}

#endif

}  // namespace
}  // namespace dsactor::actors
