// RendezvousServer / RendezvousClient on 127.0.0.1, keyed (testing::TestStore): the Store
// semantics Gloo relies on, timeouts that name the key, atomic counters, rank assignment
// through join, blob broadcast. Threads meet on futures, never on sleeps, and no duration is
// asserted: a timeout is recognised by the error it produces, which names the key and the
// time allowed. What strangers cannot do is tests/security/test_rendezvous_attacks.cpp.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <set>

#include "actors/collectives/rendezvous_store.h"
#include "tests/collectives/collectives_test_util.h"

namespace dsactor::actors {
namespace {

using namespace std::chrono_literals;
using testing::TestStore;

std::vector<char> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

TEST(RendezvousStore, SetGetOverwriteAndRemove) {
  TestStore server;
  auto c = server.client("job-a", 2s);
  c->set("k", bytes("v1"));
  EXPECT_EQ(c->get("k"), bytes("v1"));
  c->set("k", bytes("v2"));
  EXPECT_EQ(c->get("k"), bytes("v2"));
  // Binary values survive unchanged, empty ones too.
  std::vector<char> bin{0, '\xff', 0, 7};
  c->set("bin", bin);
  EXPECT_EQ(c->get("bin"), bin);
  c->set("empty", {});
  EXPECT_TRUE(c->get("empty").empty());
  EXPECT_TRUE(c->remove("k"));
  EXPECT_FALSE(c->remove("k"));
  EXPECT_THROW(c->get("k", 50ms), RendezvousError);
}

TEST(RendezvousStore, KeysAreScopedByJob) {
  TestStore server;
  auto a = server.client("job-a", 2s);
  auto b = server.client("job-b", 2s);
  a->set("k", bytes("from a"));
  b->set("k", bytes("from b"));
  EXPECT_EQ(a->get("k"), bytes("from a"));
  EXPECT_EQ(b->get("k"), bytes("from b"));
  const auto stats = server.server.stats();
  EXPECT_EQ(stats.jobs, 2u);
  EXPECT_EQ(stats.keys, 2u);
}

TEST(RendezvousStore, GetBlocksUntilAnotherClientSets) {
  TestStore server;
  auto c = server.client("j", 30s);
  // The key is missing when the get starts: only the other client's set can answer it.
  ASSERT_THROW(c->get("late", 1ms), RendezvousError);
  std::promise<void> asking;
  auto getter = std::async(std::launch::async, [&] {
    asking.set_value();
    return c->get("late");
  });
  asking.get_future().wait();
  server.client("j", 30s)->set("late", bytes("here"));
  EXPECT_EQ(getter.get(), bytes("here"));
}

TEST(RendezvousStore, WaitForSeveralKeys) {
  TestStore server;
  auto c = server.client("j", 30s);
  auto s = server.client("j", 30s);
  s->set("w0", bytes("x"));  // one key is there before the wait, the others come after it
  std::promise<void> waiting;
  auto waiter = std::async(std::launch::async, [&] {
    waiting.set_value();
    c->wait({"w0", "w1", "w2"});
  });
  waiting.get_future().wait();
  for (const char* key : {"w1", "w2"}) s->set(key, bytes("x"));
  waiter.get();
  EXPECT_NO_THROW(c->wait({"w0", "w2"}, 10ms));
}

TEST(RendezvousStore, MissingKeyTimesOutNamingKeyJobAndEndpoint) {
  TestStore server;
  auto c = server.client("job-x", 300ms);
  c->set("present", bytes("1"));
  try {
    c->get("never");
    FAIL() << "get of a missing key returned";
  } catch (const RendezvousError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'never'"), std::string::npos) << m;
    EXPECT_NE(m.find("job-x"), std::string::npos) << m;
    EXPECT_NE(m.find(server.endpoint()), std::string::npos) << m;
    // The timeout ended it (not a refusal or a lost server): the message says which.
    EXPECT_NE(m.find("300 ms"), std::string::npos) << m;
    EXPECT_EQ(m.find("did not answer"), std::string::npos) << m;
  }
  // wait names the first missing key of the list.
  try {
    c->wait({"present", "absent"}, 100ms);
    FAIL() << "wait returned";
  } catch (const RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("'absent'"), std::string::npos) << e.what();
  }
  // The client is still usable after timeouts (stale replies are skipped).
  EXPECT_EQ(c->get("present"), bytes("1"));
}

TEST(RendezvousStore, NoServerMeansAClearErrorWithinTheTimeout) {
  std::string endpoint;
  const auto keys = shared_key_security(security::generate_keypair());
  {
    RendezvousServer gone("tcp://127.0.0.1:*", keys.server);  // take a port, then free it
    endpoint = gone.endpoint();
  }
  RendezvousClient c(endpoint, "j", keys.client, generate_job_token(), 300ms);
  try {
    c.set("k", bytes("v"));
    FAIL() << "set without a server returned";
  } catch (const RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("did not answer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(endpoint), std::string::npos) << e.what();
    // A keyed client's message names the keys as a cause as well.
    EXPECT_NE(std::string(e.what()).find("--coordinator-key"), std::string::npos) << e.what();
  }
}

TEST(RendezvousStore, BindingATakenPortThrows) {
  TestStore server;
  EXPECT_THROW(RendezvousServer second(server.endpoint(), server.keys.server), RendezvousError);
}

TEST(RendezvousStore, AddIsAtomicAcrossClients) {
  TestStore server;
  constexpr int kThreads = 4, kAdds = 50;
  std::vector<std::future<std::vector<int64_t>>> results;
  for (int t = 0; t < kThreads; ++t) {
    results.push_back(std::async(std::launch::async, [&] {
      auto c = server.client("j", 2s);
      std::vector<int64_t> seen;
      for (int i = 0; i < kAdds; ++i) seen.push_back(c->add("ctr", 1));
      return seen;
    }));
  }
  std::set<int64_t> all;
  for (auto& r : results) {
    for (int64_t v : r.get()) EXPECT_TRUE(all.insert(v).second) << "value " << v << " twice";
  }
  EXPECT_EQ(all.size(), size_t{kThreads * kAdds});
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
  auto c = server.client("j", 2s);
  EXPECT_EQ(c->add("ctr", -10), kThreads * kAdds - 10);
  // A non-counter value is refused with a message.
  c->set("text", bytes("abc"));
  EXPECT_THROW(c->add("text", 1), RendezvousError);
}

TEST(RendezvousStore, AssignRankGivesEachRankExactlyOnce) {
  TestStore server;
  constexpr int kWorld = 5;
  std::vector<std::future<int>> ranks;
  for (int t = 0; t < kWorld; ++t) {
    ranks.push_back(std::async(std::launch::async, [&] {
      auto c = server.client("job-ranks", 2s);
      return assign_rank(*c, kWorld);
    }));
  }
  std::vector<int> got;
  for (auto& r : ranks) got.push_back(r.get());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<int>{0, 1, 2, 3, 4}));
  // One process too many: refused with the job named.
  try {
    assign_rank(*server.client("job-ranks", 2s), kWorld);
    FAIL() << "sixth rank assigned";
  } catch (const RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("job-ranks"), std::string::npos) << e.what();
  }
  // Another job counts from 0 again; a second group of the same job too.
  EXPECT_EQ(assign_rank(*server.client("job-other", 2s), 2), 0);
  EXPECT_EQ(assign_rank(*server.client("job-ranks", 2s), 2, "second-group"), 0);
}

TEST(RendezvousStore, JoiningWithAnotherWorldSizeIsRefused) {
  TestStore server;
  auto c = server.client("j", 2s);
  EXPECT_EQ(assign_rank(*c, 3), 0);
  try {
    assign_rank(*c, 4);
    FAIL() << "joined with another world size";
  } catch (const RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("world size 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(assign_rank(*c, 3), 1);  // the refusal took no rank
}

TEST(RendezvousStore, BroadcastBlobReachesEveryRank) {
  TestStore server;
  const std::vector<char> id{'\x01', '\x00', '\x7f', 'n', 'c', 'c', 'l'};
  // The others start waiting before the root (rank 1) publishes.
  std::vector<std::future<std::vector<char>>> got;
  std::vector<std::promise<void>> waiting(3);
  for (int r : {0, 2}) {
    got.push_back(std::async(std::launch::async, [&, r] {
      auto c = server.client("j", 30s);
      waiting[r].set_value();
      return broadcast_blob(*c, "nccl_id", r, 1);
    }));
  }
  for (int r : {0, 2}) waiting[r].get_future().wait();
  EXPECT_EQ(broadcast_blob(*server.client("j", 30s), "nccl_id", 1, 1, id), id);
  for (auto& g : got) EXPECT_EQ(g.get(), id);
}

TEST(RendezvousStore, RefusesMoreKeysThanTheJobLimit) {
  RendezvousServerOptions opts;
  opts.max_keys_per_job = 3;
  TestStore server(opts);
  auto c = server.client("j", 2s);
  for (const char* key : {"k0", "k1", "k2"}) c->set(key, bytes("v"));
  c->set("k0", bytes("overwrite is fine"));
  EXPECT_THROW(c->set("k3", bytes("v")), RendezvousError);
}

}  // namespace
}  // namespace dsactor::actors
