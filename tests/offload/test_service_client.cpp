// The typed service client: requests posted without waiting run in posting order and
// answer through their futures, each as one ServiceResult. Against a real `dsactor start
// --role offload` process for the operations, and against a FakeService (a ROUTER the test
// answers by hand) for timing: the test sees each request arrive and decides when, how and
// whether it is answered, so it synchronizes on those events, never on time.

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include "actors/offload_link/service_client.h"
#include "actors/runtime/runtime.h"
#include "messages/arena_handoff.h"
#include "tests/offload/fake_service.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using actors::ServiceClient;
using actors::ServiceFailure;
using msg::DType;
using namespace std::chrono_literals;

// Bytes that stay alive until ZeroMQ has sent them (the zero-copy owner of a payload).
template <class T>
std::shared_ptr<const std::vector<T>> held(std::vector<T> v) {
  return std::make_shared<const std::vector<T>>(std::move(v));
}

class ServiceClientTest : public SharedServiceTest {
 protected:
  actors::Runtime runtime_;
};

// Three micro-steps' pushes posted back to back, then a commit and a fetch, all before any
// answer is read: the service accepts a micro-step only after the one before it, so the
// pushes succeed only if the client sent them in posting order. The fetched parameters
// equal the reference Adam step on the summed gradient.
TEST_F(ServiceClientTest, PostedRequestsRunInPostingOrder) {
  ServiceClient client(runtime_.system(), svc_->endpoint(), svc_->client_security(), 10s,
                       "ordered");
  const auto s = spec(1, 5000);
  const auto init = held(random_floats(s.element_count, 3));
  auto registered = client.register_partitions(0, 1, {s});
  auto set = client.set_parameters(1, 0, DType::fp32, bytes_of(*init), init);
  RefPartition ref(s, *init);
  std::vector<actors::ServiceFuture<msg::PushReply>> pushes;
  for (uint32_t micro = 0; micro < 3; ++micro) {
    auto g = held(random_floats(s.element_count, 10 + micro));
    ref.accumulate(*g, micro == 0);
    pushes.push_back(client.push_gradients(1, 1, micro, DType::fp32, bytes_of(*g), g));
  }
  auto commit = client.commit(msg::CommitStep{1, 1.0, 1.0, 1e-3});
  auto fetched = client.fetch(1, 1, DType::fp32);

  ASSERT_TRUE(registered.get().ok());
  ASSERT_TRUE(set.get().ok());
  for (uint32_t micro = 0; micro < 3; ++micro) {
    auto r = pushes[micro].get();
    ASSERT_TRUE(r.ok()) << "micro-step " << micro << ": " << actors::describe(r.error());
    EXPECT_EQ(r->micro_step, micro);
  }
  auto c = commit.get();
  ASSERT_TRUE(c.ok()) << actors::describe(c.error());
  EXPECT_TRUE(c->applied);
  auto f = fetched.get();
  ASSERT_TRUE(f.ok()) << actors::describe(f.error());
  EXPECT_EQ(f->reply.version, 1u);
  ref.step(1.0, 1.0, 1e-3);
  expect_bits_equal(ref.master, f->bytes(), "fetched after the commit");
  auto stats = client.stats().get();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->steps, 1u);
}

// A refusal is a `refused` failure with the service's code and words; the client goes on
// serving the requests after it.
TEST_F(ServiceClientTest, ARefusalIsARefusedFailure) {
  ServiceClient client(runtime_.system(), svc_->endpoint(), svc_->client_security(), 10s,
                       "refused");
  auto refused = client.fetch(77, 0, DType::fp32);
  auto after = client.register_partitions(0, 1, {spec(2, 100)});
  auto r = refused.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ServiceFailure::Kind::refused);
  EXPECT_EQ(r.error().code, msg::ErrorCode::unknownPartition);
  EXPECT_NE(r.error().message.find("77"), std::string::npos) << r.error().message;
  EXPECT_EQ(actors::describe(r.error()).rfind("unknownPartition: ", 0), 0u)
      << actors::describe(r.error());
  auto a = after.get();
  ASSERT_TRUE(a.ok()) << actors::describe(a.error());
  EXPECT_EQ(a->partitions.size(), 1u);
}

// A request's answer is there when the service has answered it, not before: posting does
// not wait for the service.
TEST(ServiceClientTiming, AnAnswerComesWhenTheServiceAnswers) {
  actors::Runtime runtime;
  FakeService fake;
  ServiceClient client(runtime.system(), fake.endpoint(), fake.client_security(), 600s, "timing");
  auto stats = client.stats();
  const FakeService::Request request = fake.next();
  ASSERT_TRUE(std::holds_alternative<msg::Stats>(request.header.body));
  EXPECT_EQ(request.header.job_id, "timing");
  EXPECT_EQ(stats.wait_for(0s), std::future_status::timeout) << "answered before the service";
  msg::StatsReply reply;
  reply.partitions = 7;
  fake.answer(request, reply);
  auto r = stats.get();
  ASSERT_TRUE(r.ok()) << actors::describe(r.error());
  EXPECT_EQ(r->partitions, 7u);
}

// No answer within the timeout is a `timeout` failure naming the endpoint, the request and
// the timeout; the answer that still comes later is skipped, and the next request gets its
// own answer.
TEST(ServiceClientTiming, ATimeoutIsATimeoutFailureAndItsLateAnswerIsSkipped) {
  actors::Runtime runtime;
  FakeService fake;
  ServiceClient client(runtime.system(), fake.endpoint(), fake.client_security(), 200ms, "late");
  auto first = client.stats();
  const FakeService::Request unanswered = fake.next();
  auto r = first.get();  // the service never answers in time
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ServiceFailure::Kind::timeout);
  const std::string& what = r.error().message;
  EXPECT_NE(what.find(fake.endpoint()), std::string::npos) << what;
  EXPECT_NE(what.find("did not answer stats"), std::string::npos) << what;
  EXPECT_NE(what.find("within 200 ms"), std::string::npos) << what;

  msg::StatsReply late;
  late.partitions = 1;
  fake.answer(unanswered, late);  // queued ahead of the next request's answer
  auto second = client.stats();
  const FakeService::Request next = fake.next();
  msg::StatsReply own;
  own.partitions = 2;
  fake.answer(next, own);
  auto s = second.get();
  ASSERT_TRUE(s.ok()) << actors::describe(s.error());
  EXPECT_EQ(s->partitions, 2u);
}

// Maps an arena of `slots` slots of `slot_bytes` between `client` and the stand-in: the
// ticket, the memfd over a Unix socket the test listens on, the mapping.
void grant_arena(FakeService& fake, ServiceClient& client, size_t slot_bytes, size_t slots) {
  auto mapped = client.map_arena(slot_bytes, slots, {});
  msg::FdDoor door("dsactor-test-door-" + std::to_string(::getpid()));
  auto ask = fake.next();
  ASSERT_TRUE(std::holds_alternative<msg::MapArena>(ask.header.body));
  const uint64_t size = std::get<msg::MapArena>(ask.header.body).size;
  fake.answer(ask, msg::MapArenaReply{0, size, "ticket", door.address()});
  pollfd door_ready{door.fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&door_ready, 1, 60000), 1) << "the client never came to the door";
  const int connection = ::accept4(door.fd(), nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(connection, 0);
  std::string why;
  const auto handed = msg::receive_fd(connection, 10s, why);
  msg::answer_hand_over(connection, handed ? "ok" : why);
  ::close(connection);
  ASSERT_TRUE(handed) << why;
  auto map = fake.next();
  fake.answer(map, msg::MapArenaReply{1, size, "", ""});
  auto r = mapped.get();
  ASSERT_TRUE(r.ok() && r.value()) << "the arena was not mapped";
}

// What a push group is for: every push of it is on the wire before the first answer, so a
// service takes them in one wake-up. The stand-in receives both requests while it has
// answered neither, then answers them in reverse; each future gets its own answer, and the
// slots come back with them.
TEST(ServiceClientTiming, APushGroupIsSentBeforeAnyAnswer) {
  FakeService fake;
  actors::Runtime runtime;
  ServiceClient client(runtime.system(), fake.endpoint(), fake.client_security(), 10s, "group");
  grant_arena(fake, client, 4096, 2);
  if (HasFatalFailure()) return;
  std::vector<actors::ArenaPush> pushes;
  for (uint64_t id : {1u, 2u}) {
    actors::ArenaBuffer slot = client.arena_buffer(64);
    ASSERT_TRUE(slot);
    pushes.push_back({id, 1, 0, DType::fp32, 16, std::move(slot), false});
  }
  auto answers = client.push_gradients(std::move(pushes));
  const auto a = fake.next();
  const auto b = fake.next();  // before any answer: the group went together
  ASSERT_TRUE(std::holds_alternative<msg::PushGradients>(a.header.body));
  ASSERT_TRUE(std::holds_alternative<msg::PushGradients>(b.header.body));
  EXPECT_EQ(std::get<msg::PushGradients>(a.header.body).partition_id, 1u);
  EXPECT_EQ(std::get<msg::PushGradients>(b.header.body).partition_id, 2u);
  EXPECT_TRUE(std::get<msg::PushGradients>(b.header.body).arena.has_value());
  fake.answer(b, msg::PushReply{2, 1, 0, 2.0, false, false});
  fake.answer(a, msg::PushReply{1, 1, 0, 1.0, false, false});
  auto first = answers[0].get(), second = answers[1].get();
  ASSERT_TRUE(first.ok()) << actors::describe(first.error());
  ASSERT_TRUE(second.ok()) << actors::describe(second.error());
  EXPECT_EQ(first->reply.sum_squares, 1.0);
  EXPECT_EQ(second->reply.sum_squares, 2.0);
  EXPECT_TRUE(client.arena_buffer(4096) && client.arena_buffer(4096)) << "slots came back";
}

// An answer of another kind, and one the service could not tie to a request (id 0), are
// failures too: `failed` for the first, naming both kinds; `refused` for the second.
TEST(ServiceClientTiming, UnusableAnswersAreFailures) {
  actors::Runtime runtime;
  FakeService fake;
  ServiceClient client(runtime.system(), fake.endpoint(), fake.client_security(), 600s, "odd");
  auto commit = client.commit(msg::CommitStep{1, 1.0, 1.0, 1e-3});
  fake.answer(fake.next(), msg::StatsReply{});
  auto r = commit.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ServiceFailure::Kind::failed);
  EXPECT_NE(r.error().message.find("answered commitStep with stats"), std::string::npos)
      << r.error().message;

  auto skip = client.skip(1);
  fake.answer(fake.next(), msg::ErrorReply{msg::ErrorCode::malformed, "unreadable header"}, 0);
  auto e = skip.get();
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().kind, ServiceFailure::Kind::refused);
  EXPECT_EQ(e.error().code, msg::ErrorCode::malformed);
}

// A slot taken and filled on this thread goes with a posted push and is free again once
// the answer is in, so the one slot serves every push.
// A fetch over frames in ranges (fetch_into) is pipelined: the first kFetchRangeWindow
// ranges are on their way before any is answered, the next goes out as each reply comes in,
// and each reply is taken in order as it arrives. A range from another version than the
// first one's is a failure naming both, after which nothing more is taken. A service older
// than ranges answers each with the whole partition: the first is the fetch.
TEST(ServiceClientTiming, AFetchInRangesIsPipelinedAndOneVersion) {
  actors::Runtime runtime;
  FakeService fake;
  ServiceClient client(runtime.system(), fake.endpoint(), fake.client_security(), 600s, "ranges");
  client.set_fetch_part_bytes(4096);  // 1024 fp32 a range
  constexpr uint64_t kRange = 1024, kRanges = actors::kFetchRangeWindow + 2;
  constexpr uint64_t kCount = kRange * kRanges - 100;  // the last range shorter
  std::vector<float> values(kCount);
  for (size_t i = 0; i < kCount; ++i) values[i] = static_cast<float>(i) * 0.5f;
  auto answer = [&](const FakeService::Request& r, uint64_t version) {
    const auto& f = std::get<msg::FetchParameters>(r.header.body);
    msg::FetchReply reply{f.partition_id, version, DType::fp32, kCount, {}};
    reply.range_offset = f.range_offset;
    reply.range_count = f.range_count;
    fake.answer(r, reply, std::as_bytes(std::span(values).subspan(f.range_offset, f.range_count)));
  };
  for (const std::string mode : {"one version", "mixed", "older service"}) {
    SCOPED_TRACE(mode);
    const bool mixed = mode == "mixed";
    std::vector<float> block(kCount, -1.0f);
    std::atomic<size_t> taken{0};
    auto fetched = client.fetch_into(7, 3, DType::fp32, kCount, [&](actors::FetchedParameters&& f) {
      const auto bytes = f.bytes();
      std::memcpy(block.data() + f.reply.range_offset, bytes.data(), bytes.size());
      ++taken;
    });
    std::vector<FakeService::Request> sent;
    for (size_t i = 0; i < actors::kFetchRangeWindow; ++i) sent.push_back(fake.next());
    EXPECT_EQ(taken.load(), 0u) << "the window went out before any answer";
    for (size_t i = 0; i < sent.size(); ++i) {
      const auto& f = std::get<msg::FetchParameters>(sent[i].header.body);
      EXPECT_EQ(f.partition_id, 7u);
      EXPECT_EQ(f.min_version, 3u);
      EXPECT_EQ(f.range_offset, i * kRange);
      EXPECT_EQ(f.range_count, kRange);
    }
    if (mode == "older service") {
      // It ignores the range and answers the whole partition, to each of the requests.
      for (const auto& r : sent)
        fake.answer(r, msg::FetchReply{7, 4, DType::fp32, kCount, {}},
                    std::as_bytes(std::span(values)));
      ASSERT_EQ(fetched.wait_for(60s), std::future_status::ready) << "still waiting for ranges";
      const auto got = fetched.get();
      ASSERT_TRUE(got.ok()) << actors::describe(got.error());
      EXPECT_EQ(got->version, 4u);
      EXPECT_EQ(taken.load(), 1u);
      EXPECT_EQ(block, values);
      auto stats = client.stats();  // the other whole answers were skipped
      const FakeService::Request request = fake.next();
      ASSERT_TRUE(std::holds_alternative<msg::Stats>(request.header.body));
      fake.answer(request, msg::StatsReply{});
      EXPECT_TRUE(stats.get().ok());
      continue;
    }
    if (mixed) {
      answer(sent[0], 4);
      sent.push_back(fake.next());  // the next range goes out as the first reply comes in
      answer(sent[1], 5);
      // The guard only keeps a broken client from hanging the test.
      ASSERT_EQ(fetched.wait_for(60s), std::future_status::ready) << "still waiting for ranges";
      const auto r = fetched.get();
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.error().kind, ServiceFailure::Kind::failed);
      EXPECT_NE(r.error().message.find("at version 5, its first range at version 4"),
                std::string::npos)
          << r.error().message;
      EXPECT_EQ(taken.load(), 1u);
      // The ranges abandoned get answers the client skips: the next request gets its own.
      for (size_t i = 2; i < sent.size(); ++i) answer(sent[i], 5);
      auto stats = client.stats();
      const FakeService::Request request = fake.next();
      ASSERT_TRUE(std::holds_alternative<msg::Stats>(request.header.body));
      fake.answer(request, msg::StatsReply{});
      EXPECT_TRUE(stats.get().ok());
      continue;
    }
    for (size_t i = 0; i < kRanges; ++i) {
      answer(sent[i], 4);
      if (sent.size() < kRanges) sent.push_back(fake.next());
    }
    const auto r = fetched.get();
    ASSERT_TRUE(r.ok()) << actors::describe(r.error());
    EXPECT_EQ(r->version, 4u);
    EXPECT_EQ(r->element_count, kCount);
    EXPECT_FALSE(r->ranged()) << "the whole partition's header";
    EXPECT_EQ(taken.load(), kRanges);
    const auto& last = std::get<msg::FetchParameters>(sent.back().header.body);
    EXPECT_EQ(last.range_count, kCount - (kRanges - 1) * kRange);
    EXPECT_EQ(block, values);
  }
}

TEST_F(ServiceClientTest, ArenaSlotsTravelWithPushes) {
  ServiceClient client(runtime_.system(), svc_->endpoint(), svc_->client_security(), 10s, "arena");
  const auto s = spec(3, 4096);
  const auto init = held(random_floats(s.element_count, 5));
  ASSERT_TRUE(client.register_partitions(0, 1, {s}).get().ok());
  ASSERT_TRUE(client.set_parameters(3, 0, DType::fp32, bytes_of(*init), init).get().ok());
  auto mapped = client.map_arena(4096 * 4, 1, {}).get();
  ASSERT_TRUE(mapped.ok() && mapped.value());
  ASSERT_TRUE(client.has_arena());
  for (uint32_t micro = 0; micro < 3; ++micro) {
    const auto g = random_floats(s.element_count, 20 + micro);
    actors::ArenaBuffer slot = client.arena_buffer(g.size() * 4);
    ASSERT_TRUE(slot) << "micro-step " << micro << ": the slot was not given back";
    EXPECT_FALSE(client.arena_buffer(4)) << "one slot, and it is taken";
    std::memcpy(slot.bytes().data(), g.data(), g.size() * 4);
    double want = 0;
    for (float x : g) want += static_cast<double>(x) * x;
    auto r = client.push_gradients(3, 1, micro, DType::fp32, g.size(), std::move(slot)).get();
    ASSERT_TRUE(r.ok()) << actors::describe(r.error());
    if (micro == 0) {
      EXPECT_NEAR(r->reply.sum_squares, want, 1e-6 * want);
    }
    EXPECT_FALSE(r->reply.kept) << "not asked to keep it";
    EXPECT_FALSE(r->lent) << "the slot goes back with the reply";
  }
}

// Pushes sent as one group: each answer goes to its own future, in order, with what the
// service computed of its own gradient; every one is a request of its own (the service
// checks each as it would alone); the slots come back with the answers. A push in the
// group that is refused fails alone, and one that cannot be sent fails with those after it
// (never sent) while those before it are answered.
TEST_F(ServiceClientTest, APushGroupAnswersEachPushOnItsOwn) {
  ServiceClient client(runtime_.system(), svc_->endpoint(), svc_->client_security(), 10s, "group");
  const std::vector<uint64_t> ids = {11, 12, 13};
  std::vector<msg::PartitionSpec> specs;
  for (uint64_t id : ids) specs.push_back(spec(id, 1000 * id));
  ASSERT_TRUE(client.register_partitions(0, 1, specs).get().ok());
  for (const auto& s : specs) {
    const auto init = held(random_floats(s.element_count, 5));
    ASSERT_TRUE(
        client.set_parameters(s.partition_id, 0, DType::fp32, bytes_of(*init), init).get().ok());
  }
  auto mapped = client.map_arena(13000 * 4, 3, {}).get();
  ASSERT_TRUE(mapped.ok() && mapped.value());
  auto group = [&](uint64_t step, uint32_t seed, std::vector<double>& want) {
    std::vector<actors::ArenaPush> pushes;
    want.clear();
    for (const auto& s : specs) {
      const auto g = random_floats(s.element_count, seed++);
      actors::ArenaBuffer slot = client.arena_buffer(g.size() * 4);
      EXPECT_TRUE(slot);
      std::memcpy(slot.bytes().data(), g.data(), g.size() * 4);
      double sum = 0;
      for (float x : g) sum += static_cast<double>(x) * x;
      want.push_back(sum);
      pushes.push_back({s.partition_id, step, 0, DType::fp32, g.size(), std::move(slot), false});
    }
    return pushes;
  };
  const uint64_t sent_before = client.requests_sent();
  std::vector<double> want;
  auto answers = client.push_gradients(group(1, 30, want));
  ASSERT_EQ(answers.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto r = answers[i].get();
    ASSERT_TRUE(r.ok()) << actors::describe(r.error());
    EXPECT_EQ(r->reply.partition_id, ids[i]) << "answers in the group's order";
    EXPECT_NEAR(r->reply.sum_squares, want[i], 1e-6 * want[i]);
    EXPECT_FALSE(r->lent);
  }
  EXPECT_EQ(client.requests_sent() - sent_before, ids.size()) << "a request per push";
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(client.arena_buffer(13000 * 4)) << "slots came back";

  // The middle one has no slot: it cannot be sent, nor can the last; the first is answered.
  ASSERT_TRUE(client.commit(msg::CommitStep{1, 1.0, 1.0, 1e-3}).get().ok());
  auto pushes = group(2, 40, want);
  pushes[1].grads = actors::ArenaBuffer();
  const uint64_t sent_before_failed = client.requests_sent();
  answers = client.push_gradients(std::move(pushes));
  auto first = answers[0].get(), middle = answers[1].get(), last = answers[2].get();
  ASSERT_TRUE(first.ok()) << actors::describe(first.error());
  EXPECT_NEAR(first->reply.sum_squares, want[0], 1e-6 * want[0]);
  ASSERT_FALSE(middle.ok());
  EXPECT_EQ(middle.error().kind, ServiceFailure::Kind::failed);
  EXPECT_NE(middle.error().message.find("do not fit the arena buffer"), std::string::npos)
      << middle.error().message;
  ASSERT_FALSE(last.ok());
  EXPECT_NE(last.error().message.find("not sent"), std::string::npos) << last.error().message;
  EXPECT_EQ(client.requests_sent() - sent_before_failed, 1u) << "only the first was sent";
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(client.arena_buffer(13000 * 4)) << "slots came back";

  // Of the two not pushed yet, the first names a step the job is not at: refused alone,
  // and the push after it is answered.
  pushes = group(2, 60, want);
  pushes.erase(pushes.begin());
  want.erase(want.begin());
  pushes[0].step = 7;
  answers = client.push_gradients(std::move(pushes));
  auto refused = answers[0].get(), after = answers[1].get();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().kind, ServiceFailure::Kind::refused);
  EXPECT_EQ(refused.error().code, msg::ErrorCode::versionOrder);
  ASSERT_TRUE(after.ok()) << actors::describe(after.error());
  EXPECT_EQ(after->reply.partition_id, 13u);
  EXPECT_NEAR(after->reply.sum_squares, want[1], 1e-6 * want[1]);
}

// A fetch into the arena: the result holds the slot the service wrote (so nothing else
// can take it) until the result goes; a fetch while it is held comes as a frame, with the
// same bytes.
TEST_F(ServiceClientTest, AFetchedSlotIsHeldByItsResult) {
  ServiceClient client(runtime_.system(), svc_->endpoint(), svc_->client_security(), 10s,
                       "fetch-arena");
  const auto s = spec(4, 2048);
  const auto init = held(random_floats(s.element_count, 6));
  ASSERT_TRUE(client.register_partitions(0, 1, {s}).get().ok());
  ASSERT_TRUE(client.set_parameters(4, 0, DType::fp32, bytes_of(*init), init).get().ok());
  auto mapped = client.map_arena(2048 * 4, 1, {}).get();
  ASSERT_TRUE(mapped.ok() && mapped.value());
  {
    auto in_slot = client.fetch(4, 0, DType::fp32).get();
    ASSERT_TRUE(in_slot.ok()) << actors::describe(in_slot.error());
    EXPECT_TRUE(in_slot->in_arena());
    expect_bits_equal(*init, in_slot->bytes(), "fetched into the slot");
    EXPECT_FALSE(client.arena_buffer(4)) << "the result holds the only slot";
    auto as_frame = client.fetch(4, 0, DType::fp32).get();
    ASSERT_TRUE(as_frame.ok()) << actors::describe(as_frame.error());
    EXPECT_FALSE(as_frame->in_arena());
    expect_bits_equal(*init, as_frame->bytes(), "fetched as a frame");
  }
  EXPECT_TRUE(client.arena_buffer(4)) << "the slot is free once the result is gone";
}

// Heartbeats: while a commit waits, the client pings; Pongs that report the commit further
// on keep it waiting past its timeout (which measures silence, not work), and once they
// stop moving it fails, naming the operation and how far it had got.
TEST(ServiceClientHeartbeats, ProgressKeepsALongCommitAliveAndItsStallIsNamed) {
  actors::Runtime runtime;
  FakeService fake;
  ServiceClient client(runtime.system(), fake.endpoint(), fake.client_security(), 5000ms, "slow",
                       500ms);
  auto commit = client.commit(msg::CommitStep{12, 1.0, 1.0, 1e-3});
  ASSERT_TRUE(std::holds_alternative<msg::CommitStep>(fake.next().header.body));
  int pongs = 0;
  for (uint64_t done = 1; commit.wait_for(0s) != std::future_status::ready; ++done) {
    FakeService::Request ping;
    try {
      ping = fake.next(1s);  // none once the commit has failed
    } catch (const std::runtime_error&) {
      continue;
    }
    ASSERT_TRUE(std::holds_alternative<msg::Ping>(ping.header.body));
    EXPECT_EQ(ping.header.job_id, "slow");
    // 10 partitions done: from there on the commit makes no progress.
    fake.answer(ping, msg::Pong{std::get<msg::Ping>(ping.header.body).nonce, "commitStep", 12,
                                std::min<uint64_t>(done, 10), 96, done * 500});
    pongs += done <= 10 ? 1 : 0;
  }
  EXPECT_GE(pongs, 10) << "the commit failed while its progress was reported";
  auto r = commit.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ServiceFailure::Kind::timeout);
  const std::string& what = r.error().message;
  EXPECT_NE(what.find("did not answer commitStep within 5000 ms without progress"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("in flight there: commitStep of step 12, 10/96 partitions"),
            std::string::npos)
      << what;
}

// A service that answers neither the request nor its heartbeats is declared down after 3
// heartbeat intervals, long before the request's own timeout.
TEST(ServiceClientHeartbeats, AServiceThatAnswersNothingIsDeclaredDown) {
  actors::Runtime runtime;
  FakeService fake;
  ServiceClient client(runtime.system(), fake.endpoint(), fake.client_security(), 600s, "gone",
                       100ms);
  auto stats = client.stats();
  ASSERT_TRUE(std::holds_alternative<msg::Stats>(fake.next().header.body));
  ASSERT_TRUE(std::holds_alternative<msg::Ping>(fake.next().header.body));  // unanswered
  auto r = stats.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ServiceFailure::Kind::timeout);
  const std::string& what = r.error().message;
  EXPECT_NE(what.find(fake.endpoint()), std::string::npos) << what;
  EXPECT_NE(what.find("answered neither stats"), std::string::npos) << what;
  EXPECT_NE(what.find("nor its heartbeats"), std::string::npos) << what;
}

// Pings travel on a connection of their own (another routing id at the service), so a Pong
// never queues behind large replies on the request connection; answered there, they keep a
// request alive well past the three intervals that silence would allow.
TEST(ServiceClientHeartbeats, PingsTravelOnAConnectionOfTheirOwn) {
  actors::Runtime runtime;
  FakeService fake;
  ServiceClient client(runtime.system(), fake.endpoint(), fake.client_security(), 600s, "beats",
                       200ms);
  auto stats = client.stats();
  const auto request = fake.next();
  ASSERT_TRUE(std::holds_alternative<msg::Stats>(request.header.body));
  auto connection = [](const FakeService::Request& r) {
    return r.routing.empty() ? std::string() : r.routing.front().to_string();
  };
  for (int i = 0; i < 6; ++i) {
    const auto ping = fake.next();
    ASSERT_TRUE(std::holds_alternative<msg::Ping>(ping.header.body));
    EXPECT_NE(connection(ping), connection(request)) << "a Ping on the request connection";
    fake.answer(ping, msg::Pong{std::get<msg::Ping>(ping.header.body).nonce});
  }
  fake.answer(request, msg::StatsReply{});
  auto r = stats.get();
  EXPECT_TRUE(r.ok()) << actors::describe(r.error());
}

}  // namespace
}  // namespace dsactor::offload::test
