// The attacks of issue 11 on the rendezvous store, replayed against a real keyed store on
// 127.0.0.1: a client without a key, one with a stranger's key (not on the allow-list), and
// one with a valid key but a stranger's job token. Each is refused or bounded, the job's keys
// and ranks are unchanged afterwards, and a 2-rank run still meets. Then the bounds an
// authorized client meets (jobs, keys, bytes, parked requests, timeouts). No duration is
// asserted: a refused handshake is recognised by the server's count and the client's "did not
// answer" error, a parked request by the server's count. A flood stays within the byte quota
// and the process's resident set within twice it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <zmq_addon.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <future>
#include <set>

#include "actors/collectives/rendezvous_protocol.h"
#include "tests/collectives/collectives_test_util.h"

namespace dsactor::actors {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing::TestStore;

std::vector<char> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// Waits until the store has `n` requests parked (woken by the server's own updates).
bool store_parks(const TestStore& store, size_t n) {
  return store.server.wait_for([n](const RendezvousStats& s) { return s.parked == n; }, 30s);
}

// A victim job with a value and two ranks joined through the store.
struct Victim {
  explicit Victim(TestStore& s) : store(s) {
    auto c = store.client("victim", 2s);
    c->set("gloo/rank_0", bytes("addr-0"));
  }
  void expect_untouched() const {
    auto c = store.client("victim", 2s);
    EXPECT_EQ(c->get("gloo/rank_0"), bytes("addr-0"));
    EXPECT_EQ(store.server.stats().jobs, 1u);
    EXPECT_EQ(store.server.stats().keys, 1u);
    expect_ranks_intact();
  }
  // The victim's two ranks still get ranks 0 and 1, each once: nothing the stranger sent
  // moved the join protocol.
  void expect_ranks_intact() const {
    auto first = store.client("victim", 2s), second = store.client("victim", 2s);
    std::set<int> ranks = {assign_rank(*first, 2), assign_rank(*second, 2)};
    EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  }
  TestStore& store;
};

// Every request a stranger could make, each expected to fail; none may change the victim.
void try_everything(RendezvousClient& stranger) {
  EXPECT_THROW(stranger.set("gloo/rank_0", bytes("poison")), RendezvousError);
  EXPECT_THROW(stranger.remove("gloo/rank_0"), RendezvousError);
  EXPECT_THROW(stranger.add("dsactor/ranks", 1), RendezvousError);
  EXPECT_THROW(stranger.get("gloo/rank_0", 10ms), RendezvousError);
  EXPECT_THROW(assign_rank(stranger, 2), RendezvousError);
}

TEST(RendezvousAttacks, AClientWithoutAKeyGetsNoAnswer) {
  TestStore store;
  Victim victim(store);
  security::ClientSecurity plain;
  plain.insecure = true;
  RendezvousClient stranger(store.endpoint(), "victim", plain, store.token, 300ms);
  EXPECT_THAT(error_of([&] { stranger.set("gloo/rank_0", bytes("poison")); }),
              HasSubstr("did not answer"));
  try_everything(stranger);
  victim.expect_untouched();
  EXPECT_EQ(store.server.stats().refused_requests, 0u);  // nothing of it reached the store
}

TEST(RendezvousAttacks, AStrangersKeyIsRefusedAtTheHandshake) {
  TestStore store;
  Victim victim(store);
  security::ClientSecurity stranger_keys;
  stranger_keys.keys = security::generate_keypair();     // not on the allow-list
  stranger_keys.server_key = store.server.public_key();  // knows the server's public key
  RendezvousClient stranger(store.endpoint(), "victim", stranger_keys, store.token, 300ms);
  EXPECT_THAT(error_of([&] { stranger.set("gloo/rank_0", bytes("poison")); }),
              HasSubstr("did not answer"));
  try_everything(stranger);
  EXPECT_GE(store.server.stats().refused_handshakes, 1u);
  victim.expect_untouched();
}

TEST(RendezvousAttacks, AnAuthorizedKeyWithoutTheJobsTokenIsDeniedEverything) {
  TestStore store;
  Victim victim(store);
  // A peer of the store (its key is admitted) that is not part of the victim's run.
  RendezvousClient stranger(store.endpoint(), "victim", store.keys.client, generate_job_token(),
                            2s);
  const std::string denied = error_of([&] { stranger.set("gloo/rank_0", bytes("poison")); });
  EXPECT_THAT(denied, HasSubstr("permission denied"));
  try_everything(stranger);
  // The refusal names nothing of the job: another job's refusal reads the same.
  RendezvousClient own(store.endpoint(), "its-own-job", store.keys.client, generate_job_token(),
                       2s);
  EXPECT_NO_THROW(own.set("gloo/rank_0", bytes("mine")));
  RendezvousClient other(store.endpoint(), "its-own-job", store.keys.client, generate_job_token(),
                         2s);
  EXPECT_EQ(denied, error_of([&] { other.set("gloo/rank_0", bytes("poison")); }));
  EXPECT_GE(store.server.stats().refused_requests, 5u);
  auto c = store.client("victim", 2s);
  EXPECT_EQ(c->get("gloo/rank_0"), bytes("addr-0"));
  victim.expect_ranks_intact();
}

TEST(RendezvousAttacks, AStoreGivenOneTokenRefusesEveryOther) {
  RendezvousServerOptions o;
  o.job_token = generate_job_token();
  TestStore store(o);  // its clients carry another token
  RendezvousClient member(store.endpoint(), "run", store.keys.client, *o.job_token, 2s);
  EXPECT_NO_THROW(member.set("k", bytes("v")));
  // A wrong token is refused the same way for the run's job and for a job that does not
  // exist: the reply does not say which jobs there are.
  const std::string existing = error_of([&] { store.client("run", 2s)->set("k", bytes("x")); });
  const std::string absent = error_of([&] { store.client("none", 2s)->set("k", bytes("x")); });
  EXPECT_THAT(existing, HasSubstr("permission denied"));
  EXPECT_EQ(existing, absent);
  EXPECT_EQ(store.server.stats().jobs, 1u);
  EXPECT_EQ(member.get("k"), bytes("v"));
}

// Issue 11: "One stranger's add to the rank counter broke a 2-rank run." Ranks move only
// through join, so counters of any name are the stranger's own keys; and without the run's
// token (or key) the add does not even reach the job.
TEST(RendezvousAttacks, AStrangersAddDoesNotBreakATwoRankRun) {
  TestStore store;
  const std::string job = "two-ranks";
  // A peer holding the run's token and an admitted key, adding to every counter it can name.
  auto insider = store.client(job, 2s);
  for (const char* key : {"dsactor/ranks", "dsactor/rank_counter", "rank_counter"})
    EXPECT_EQ(insider->add(key, 1), 1);
  // Strangers without the token, without a key.
  RendezvousClient no_token(store.endpoint(), job, store.keys.client, generate_job_token(), 2s);
  EXPECT_THROW(no_token.add("dsactor/ranks", 1), RendezvousError);

  GlooCollectivesOptions opts;
  opts.timeout = 20s;
  std::vector<std::future<std::vector<float>>> ranks;
  for (int t = 0; t < 2; ++t)
    ranks.push_back(std::async(std::launch::async, [&] {
      auto client = store.client(job, opts.timeout);
      const int rank = assign_rank(*client, 2);
      GlooCollectives c(rank, 2, *client, opts);
      std::vector<float> x{static_cast<float>(rank + 1)};
      c.allreduce_sum(x.data(), 1);
      x.push_back(static_cast<float>(rank));
      return x;
    }));
  std::set<float> got_ranks;
  for (auto& r : ranks) {
    const auto x = r.get();
    EXPECT_EQ(x[0], 3.f);  // 1 + 2: both ranks took part
    got_ranks.insert(x[1]);
  }
  EXPECT_EQ(got_ranks, (std::set<float>{0.f, 1.f}));
}

TEST(RendezvousAttacks, JobsKeysAndBytesAreCapped) {
  RendezvousServerOptions o;
  o.max_jobs = 3;
  o.max_keys_per_job = 8;
  o.max_bytes_per_job = 4096;
  o.max_total_bytes = 6000;
  o.max_message_bytes = 2048;
  TestStore store(o);
  // Jobs: the fourth is refused while the others are recent.
  for (int j = 0; j < 3; ++j) store.client("job" + std::to_string(j), 2s)->set("k", bytes("v"));
  EXPECT_THAT(error_of([&] { store.client("job3", 2s)->set("k", bytes("v")); }),
              HasSubstr("maximum of 3 jobs"));
  // Keys of one job.
  auto c = store.client("job0", 2s);
  for (int k = 1; k < 8; ++k) c->set("k" + std::to_string(k), bytes("v"));
  EXPECT_THAT(error_of([&] { c->set("one-too-many", bytes("v")); }), HasSubstr("8 keys"));
  // Bytes of one job, then of the store.
  const std::string kib(1000, 'x');
  auto d = store.client("job1", 2s);
  for (int k = 0; k < 4; ++k) d->set("big" + std::to_string(k), bytes(kib));
  EXPECT_THAT(error_of([&] { d->set("big4", bytes(kib)); }), HasSubstr("4096 bytes"));
  auto e = store.client("job2", 2s);
  EXPECT_THAT(error_of([&] {
                for (int k = 0; k < 4; ++k) e->set("big" + std::to_string(k), bytes(kib));
              }),
              HasSubstr("the store is full"));
  EXPECT_LE(store.server.stats().bytes, o.max_total_bytes);
  // A frame above ZMQ_MAXMSGSIZE never arrives (libzmq drops the connection before
  // allocating it), and the store goes on serving the others.
  auto f = store.client("job2", 300ms);
  EXPECT_THAT(error_of([&] { f->set("huge", std::vector<char>(4096, 'x')); }),
              HasSubstr("did not answer"));
  EXPECT_EQ(store.client("job0", 2s)->get("k"), bytes("v"));
}

// This process's resident set, from /proc/self/status (bytes).
uint64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.starts_with("VmRSS:")) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// Issue 11: "jobs are unbounded (65,536 keys x 16 MiB each)". A member of the job floods it
// with values four times its byte quota: everything past the quota is refused, the store
// holds at most the quota, and the process (store and flooding client together) grows by
// less than twice that.
TEST(RendezvousAttacks, AFloodOfValuesLeavesMemoryBounded) {
  RendezvousServerOptions o;
  o.max_bytes_per_job = uint64_t{32} << 20;
  TestStore store(o);
  auto c = store.client("flood", 30s);
  c->set("warm-up", bytes("x"));
  const uint64_t before = resident_bytes();
  const std::vector<char> value(1000 * 1024, 'v');
  int refused = 0;
  for (int k = 0; k < 128; ++k) {
    try {
      c->set("big" + std::to_string(k), value);
    } catch (const RendezvousError& e) {
      EXPECT_THAT(e.what(), HasSubstr("would hold more than"));
      ++refused;
    }
  }
  EXPECT_GE(refused, 128 - 33);
  EXPECT_LE(store.server.stats().bytes, o.max_bytes_per_job);
  EXPECT_LT(resident_bytes() - std::min(before, resident_bytes()), 2 * o.max_bytes_per_job);
  // The job still works, and deleting frees its share.
  EXPECT_TRUE(c->remove("big0"));
  EXPECT_NO_THROW(c->set("after", bytes("ok")));
}

TEST(RendezvousAttacks, AnIdleJobMakesRoomButOneWithParkedRequestsDoesNot) {
  RendezvousServerOptions o;
  o.max_jobs = 1;
  o.idle_job_expiry = 0ms;
  TestStore store(o);
  store.client("old", 2s)->set("k", bytes("v"));
  // "old" is idle and has nothing parked: a new job takes its place.
  store.client("new", 2s)->set("k", bytes("v"));
  EXPECT_EQ(store.server.stats().jobs, 1u);
  // "new" has a parked request: it stays, and the next job is refused.
  auto waiter = store.client("new", 30s);
  auto parked = std::async(std::launch::async, [&] { waiter->wait({"later"}); });
  ASSERT_TRUE(store_parks(store, 1));
  EXPECT_THAT(error_of([&] { store.client("third", 2s)->set("k", bytes("v")); }),
              HasSubstr("maximum of 1 jobs"));
  store.client("new", 2s)->set("later", bytes("x"));
  parked.get();
}

TEST(RendezvousAttacks, ParkedRequestsAreCapped) {
  RendezvousServerOptions o;
  o.max_parked = 2;
  TestStore store(o);
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  std::vector<std::future<void>> parked;
  for (int i = 0; i < 2; ++i) {
    clients.push_back(store.client("j", 30s));
    parked.push_back(
        std::async(std::launch::async, [c = clients.back().get()] { c->wait({"never-yet"}); }));
  }
  ASSERT_TRUE(store_parks(store, 2));
  EXPECT_THAT(error_of([&] { store.client("j", 30s)->wait({"never-yet"}); }), HasSubstr("busy"));
  store.client("j", 2s)->set("never-yet", bytes("now"));
  for (auto& p : parked) p.get();
  EXPECT_EQ(store.server.stats().parked, 0u);
}

// Issue 11: "Wait timeouts of 9.2e12 ms or more overflow and return at once." A huge timeout
// is clamped (to a day) and parks like any other; a set answers it "ok".
TEST(RendezvousAttacks, AnOverflowingWaitTimeoutIsClampedNotExpired) {
  TestStore store;
  auto c = store.client("j", 2s);
  auto waited = std::async(std::launch::async,
                           [&] { c->wait({"key"}, std::chrono::milliseconds(9'200'000'000'000)); });
  ASSERT_TRUE(store_parks(store, 1));
  store.client("j", 2s)->set("key", bytes("v"));
  EXPECT_NO_THROW(waited.get());

  // The same on the wire, past the client's own clamp: UINT64_MAX ms.
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  security::secure_client_socket(raw, store.keys.client);
  raw.connect(store.endpoint());
  rendezvous::Request r;
  r.id = "raw-1";
  r.op = rendezvous::Op::kGet;
  r.job = "j";
  r.token = store.token;
  r.keys = {"raw-key"};
  r.timeout_ms = UINT64_MAX;
  auto frames = rendezvous::encode_request(r);
  zmq::send_multipart(raw, frames);
  ASSERT_TRUE(store_parks(store, 1));
  store.client("j", 2s)->set("raw-key", bytes("w"));
  std::vector<zmq::message_t> reply;
  raw.set(zmq::sockopt::rcvtimeo, 30000);
  ASSERT_TRUE(zmq::recv_multipart(raw, std::back_inserter(reply)));
  ASSERT_EQ(reply.size(), 3u);
  EXPECT_EQ(reply[1].to_string(), "ok");
  EXPECT_EQ(reply[2].to_string(), "w");
}

TEST(RendezvousAttacks, MalformedRequestsAreRefusedAndTheStoreGoesOn) {
  TestStore store;
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::rcvtimeo, 30000);
  security::secure_client_socket(raw, store.keys.client);
  raw.connect(store.endpoint());
  const std::vector<std::vector<std::string>> bad = {
      {"id1", "set", "j", store.token, "k"},                          // too few arguments
      {"id2", "launch", "j", store.token},                            // unknown op
      {"id3", "get", "j", store.token, "short", "k"},                 // timeout not 8 bytes
      {"id4", "join", "j", store.token, "g", std::string(8, '\0')},   // world size 0
      {"id5", "set", "", store.token, "k", "v"},                      // empty job
      {"id6", "set", "j", store.token, std::string(2000, 'k'), "v"},  // key too long
  };
  for (const auto& request : bad) {
    std::vector<zmq::message_t> frames;
    for (const auto& f : request) frames.emplace_back(f.data(), f.size());
    zmq::send_multipart(raw, frames);
    std::vector<zmq::message_t> reply;
    ASSERT_TRUE(zmq::recv_multipart(raw, std::back_inserter(reply))) << request[0];
    ASSERT_EQ(reply.size(), 3u);
    EXPECT_EQ(reply[0].to_string(), request[0]);
    EXPECT_EQ(reply[1].to_string(), "error");
  }
  EXPECT_EQ(store.server.stats().refused_requests, bad.size());
  EXPECT_EQ(store.server.stats().jobs, 0u);  // nothing was created
  store.client("j", 2s)->set("k", bytes("fine"));
}

TEST(RendezvousAttacks, APlainStoreListensOnLoopbackOnly) {
  security::ServerSecurity plain;
  plain.insecure = true;
  EXPECT_THAT(error_of([&] { RendezvousServer s("tcp://0.0.0.0:*", plain); }),
              HasSubstr("--insecure is allowed on loopback only"));
  EXPECT_THAT(error_of([&] { RendezvousServer s("tcp://*:*", plain); }),
              HasSubstr("refusing to listen"));
  RendezvousServer loopback("tcp://127.0.0.1:*", plain);  // allowed, with a warning
  security::ClientSecurity client;
  client.insecure = true;
  RendezvousClient c(loopback.endpoint(), "j", client, "", 2s);
  c.set("k", bytes("v"));
  EXPECT_EQ(c.get("k"), bytes("v"));
}

}  // namespace
}  // namespace dsactor::actors
