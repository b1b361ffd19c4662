// The service client actor against a real `dsactor start --role offload` process:
// requests posted without waiting run in posting order on the actor's thread and answer
// through their futures; a refusal and a timeout come back as typed failures, not as
// exceptions on the caller's thread; arena slots taken on the caller's thread travel with
// a posted push and come back free.

#include <gtest/gtest.h>

#include <future>
#include <thread>
#include <vector>

#include "actors/offload_link/service_client.h"
#include "actors/runtime/runtime.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using actors::OffloadClient;
using actors::ServiceClient;
using actors::ServiceFailure;
using msg::DType;
using namespace std::chrono_literals;

class ServiceClientActor : public SharedServiceTest {
 protected:
  actors::Runtime runtime_;
};

// Three micro-steps' pushes posted back to back, then a commit and a fetch, all before
// any answer is read: the service accepts a micro-step only after the one before it, so
// the pushes succeed only if the actor sent them in posting order. The results equal the
// reference Adam step on the summed gradient, and every request ran on one thread that is
// not the caller's.
TEST_F(ServiceClientActor, PostedRequestsRunInOrderOnTheActorsThread) {
  ServiceClient client(runtime_.system(), svc_->endpoint(), 10s, "ordered");
  const auto s = spec(1, 5000);
  const auto init = random_floats(s.element_count, 3);
  ASSERT_TRUE(client.call([&](OffloadClient& c) { return c.register_partitions(0, 1, {s}); }).ok());
  ASSERT_TRUE(client
                  .call([&](OffloadClient& c) {
                    return c.set_parameters(1, 0, DType::fp32, bytes_of(init));
                  })
                  .ok());
  RefPartition ref(s, init);
  std::vector<std::future<actors::ServiceResult<msg::PushReply>>> pushes;
  std::vector<std::future<actors::ServiceResult<std::thread::id>>> threads;
  for (uint32_t micro = 0; micro < 3; ++micro) {
    auto g = random_floats(s.element_count, 10 + micro);
    ref.accumulate(g, micro == 0);
    pushes.push_back(client.post([g = std::move(g), micro](OffloadClient& c) {
      return c.push_gradients(1, 1, micro, DType::fp32, bytes_of(g));
    }));
    threads.push_back(client.post([](OffloadClient&) { return std::this_thread::get_id(); }));
  }
  auto commit = client.post([](OffloadClient& c) {
    return c.commit(msg::CommitStep{1, 1.0, 1.0, 1e-3});
  });
  auto fetched = client.post([](OffloadClient& c) {
    auto f = c.fetch(1, 1, DType::fp32);
    return std::vector<std::byte>(f.bytes().begin(), f.bytes().end());
  });
  for (uint32_t micro = 0; micro < 3; ++micro) {
    auto r = pushes[micro].get();
    ASSERT_TRUE(r.ok()) << "micro-step " << micro << ": " << r.error().message;
    EXPECT_EQ(r.value().micro_step, micro);
  }
  ASSERT_TRUE(commit.get().ok());
  auto bytes = fetched.get();
  ASSERT_TRUE(bytes.ok());
  ref.step(1.0, 1.0, 1e-3);
  expect_bits_equal(ref.master, bytes.value(), "fetched after the commit");
  const std::thread::id actor_thread = threads[0].get().value();
  EXPECT_NE(actor_thread, std::this_thread::get_id());
  for (size_t i = 1; i < threads.size(); ++i) EXPECT_EQ(threads[i].get().value(), actor_thread);
}

// A refusal is a typed failure with the service's code and message; the actor goes on
// serving the requests after it.
TEST_F(ServiceClientActor, ARefusalIsATypedFailure) {
  ServiceClient client(runtime_.system(), svc_->endpoint(), 10s, "refused");
  auto refused = client.post([](OffloadClient& c) { return c.fetch(77, 0, DType::fp32).reply; });
  auto after = client.post([](OffloadClient& c) {
    return c.register_partitions(0, 1, {spec(2, 100)}).partitions.size();
  });
  auto r = refused.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ServiceFailure::Kind::refused);
  EXPECT_EQ(r.error().code, msg::ErrorCode::unknownPartition);
  EXPECT_NE(r.error().message.find("77"), std::string::npos) << r.error().message;
  auto a = after.get();
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a.value(), 1u);
}

// Nothing listens: the request's answer is a timeout failure, after the client's timeout
// and not before (posting returned at once), and other exceptions become `failed` with
// the exception kept for callers that know its type.
TEST_F(ServiceClientActor, TimeoutsAndOtherErrorsAreTypedFailures) {
  ServiceClient silent(runtime_.system(), "tcp://127.0.0.1:9", 300ms, "silent");
  auto stats = silent.post([](OffloadClient& c) { return c.stats(); });
  EXPECT_EQ(stats.wait_for(0ms), std::future_status::timeout);
  auto r = stats.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ServiceFailure::Kind::timeout);
  EXPECT_NE(r.error().message.find("127.0.0.1:9"), std::string::npos) << r.error().message;

  ServiceClient client(runtime_.system(), svc_->endpoint(), 10s, "failed");
  auto thrown = client.call([](OffloadClient&) -> int { throw std::out_of_range("local bug"); });
  ASSERT_FALSE(thrown.ok());
  EXPECT_EQ(thrown.error().kind, ServiceFailure::Kind::failed);
  EXPECT_EQ(thrown.error().message, "local bug");
  EXPECT_THROW(std::rethrow_exception(thrown.error().error), std::out_of_range);
}

// A slot taken and filled on this thread goes with a posted push; the actor releases it
// when the reply is in, so the one slot is free again for the next push.
TEST_F(ServiceClientActor, ArenaSlotsTravelWithPostedPushes) {
  ServiceClient client(runtime_.system(), svc_->endpoint(), 10s, "arena");
  const auto s = spec(3, 4096);
  ASSERT_TRUE(client.call([&](OffloadClient& c) { return c.register_partitions(0, 1, {s}); }).ok());
  ASSERT_TRUE(client
                  .call([&](OffloadClient& c) {
                    return c.set_parameters(3, 0, DType::fp32,
                                            bytes_of(random_floats(s.element_count, 5)));
                  })
                  .ok());
  auto mapped = client.call([](OffloadClient& c) { return c.map_arena(4096 * 4, 1); });
  ASSERT_TRUE(mapped.ok() && mapped.value());
  ASSERT_TRUE(client.has_arena());
  for (uint32_t micro = 0; micro < 3; ++micro) {
    const auto g = random_floats(s.element_count, 20 + micro);
    auto slot = std::make_shared<actors::ArenaBuffer>(client.arena_buffer(g.size() * 4));
    ASSERT_TRUE(*slot) << "micro-step " << micro << ": the slot was not given back";
    EXPECT_FALSE(client.arena_buffer(4)) << "one slot, and it is taken";
    std::memcpy(slot->bytes().data(), g.data(), g.size() * 4);
    double want = 0;
    for (float x : g) want += static_cast<double>(x) * x;
    auto r = client.call([slot, micro, n = g.size()](OffloadClient& c) {
      return c.receive_push_reply(
          c.send_push_gradients(3, 1, micro, DType::fp32, n, std::move(*slot)));
    });
    ASSERT_TRUE(r.ok()) << r.error().message;
    if (micro == 0) {
      EXPECT_NEAR(r.value().sum_squares, want, 1e-6 * want);
    }
  }
}

}  // namespace
}  // namespace dsactor::offload::test
