// What one client may take from the offload service, and its memory under floods, against
// real keyed services: a Register flood ends at the memory limit and the partition caps, a
// client's 300 jobs end at its job quota (DropJob frees one), and a flood of pushes sent
// without waiting for answers is answered `busy` past the in-flight limits while the
// service's resident memory (VmRSS) stays bounded. A client that gets `busy` retries with
// backoff and every request goes through. The victim's weights stay bit-identical.

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "tests/security/offload_attack_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using actors::OffloadError;
using msg::DType;
using msg::ErrorCode;

constexpr uint64_t kMiB = uint64_t{1} << 20;

using OffloadQuotas = OffloadAttack;

// The refusal a request gets (an ErrorReply expected).
msg::ErrorReply refused(actors::OffloadClient& c, msg::Body body) {
  const msg::Header h = c.call(std::move(body));
  const auto* e = std::get_if<msg::ErrorReply>(&h.body);
  EXPECT_NE(e, nullptr) << "answered " << msg::kind_name(h.body);
  return e ? *e : msg::ErrorReply{};
}

TEST_F(OffloadQuotas, TheDefaultMemoryLimitIsPrintedAtStart) {
  start();
  EXPECT_NE(service_->log().find("default: half of physical memory"), std::string::npos)
      << service_->log();
}

TEST_F(OffloadQuotas, ARegisterFloodStopsAtTheLimitsAndTheMemoryStaysBounded) {
  const uint64_t limit = 128 * kMiB;
  start({"--memory-limit", std::to_string(limit), "--max-partition-bytes", "16M",
         "--max-partitions-per-register", "64"});
  const uint64_t base = rss_bytes(service_->pid());
  auto attacker = client(stranger(), "flood");
  // One small Register asking for far more than the limit, a partition over the size cap,
  // and more partitions than one Register may list.
  msg::Register huge{0, 1, {}};
  for (uint64_t i = 0; i < 60; ++i) huge.partitions.push_back(spec(i, 4 * kMiB / 4));
  EXPECT_EQ(refused(*attacker, huge).code, ErrorCode::outOfMemory);
  auto e = refused(*attacker, msg::Register{0, 1, {spec(1, 8 * kMiB)}});
  EXPECT_EQ(e.code, ErrorCode::tooLarge);
  EXPECT_NE(e.message.find("--max-partition-bytes"), std::string::npos) << e.message;
  msg::Register many{0, 1, {}};
  for (uint64_t i = 0; i < 65; ++i) many.partitions.push_back(spec(i, 1));
  e = refused(*attacker, many);
  EXPECT_EQ(e.code, ErrorCode::tooLarge);
  EXPECT_NE(e.message.find("--max-partitions-per-register"), std::string::npos) << e.message;
  // Jobs of 4 MiB partitions, registered until the memory limit says no.
  size_t accepted = 0;
  for (int j = 0; j < 64; ++j) {
    auto c = client(stranger(), "flood-" + std::to_string(j));
    const msg::Header h = c->call(msg::Register{0, 1, {spec(1, 4 * kMiB / 4)}});
    if (const auto* err = std::get_if<msg::ErrorReply>(&h.body)) {
      EXPECT_EQ(err->code, ErrorCode::outOfMemory) << err->message;
      break;
    }
    ++accepted;
  }
  EXPECT_GT(accepted, 0u);
  EXPECT_LT(accepted, 64u);
  EXPECT_LE(victim_->stats().bytes_in_ram, limit);
  const uint64_t rss = rss_bytes(service_->pid());
  EXPECT_LT(rss, base + limit + 64 * kMiB) << "VmRSS " << rss << " from " << base;
  expect_victim_untouched();
}

TEST_F(OffloadQuotas, AClientsJobsEndAtItsQuotaAndDropJobFreesOne) {
  start({"--max-jobs-per-client", "32"});
  client(stranger(), "x")->register_partitions(0, 1, {spec(1, 16)});
  size_t accepted = 0;
  std::string refusal;
  for (int j = 0; j < 300; ++j) {
    auto job = client(stranger(), "job-" + std::to_string(j));
    const msg::Header r = job->call(msg::Register{0, 1, {spec(1, 16)}});
    if (const auto* err = std::get_if<msg::ErrorReply>(&r.body)) {
      EXPECT_EQ(err->code, ErrorCode::tooLarge) << err->message;
      refusal = err->message;
    } else {
      ++accepted;
    }
  }
  // Job "x" and 31 of the 300; the others refused, naming the quota.
  EXPECT_EQ(accepted, 31u);
  EXPECT_NE(refusal.find("--max-jobs-per-client"), std::string::npos) << refusal;
  // Another client's quota is its own: the victim registers on.
  auto victims_second = client(service_->client_security(), "victim-2");
  victims_second->register_partitions(0, 1, {spec(1, 16)});
  // A dropped job makes room for one more.
  client(stranger(), "job-0")->drop_job();
  client(stranger(), "job-299")->register_partitions(0, 1, {spec(1, 16)});
  auto late = client(stranger(), "job-late");
  EXPECT_EQ(refused(*late, msg::Register{0, 1, {spec(1, 16)}}).code, ErrorCode::tooLarge);
  expect_victim_untouched();
}

TEST_F(OffloadQuotas, APushFloodIsAnsweredBusyAndTheMemoryStaysBounded) {
  const uint64_t n = 2 * kMiB;  // 8 MiB of fp32 per push
  start({"--max-requests-in-flight", "4", "--max-bytes-in-flight-per-client", "32M",
         "--max-bytes-in-flight", "48M", "--workers", "1", "--no-mlock"});
  auto owner = client(stranger(), "pushes");
  owner->register_partitions(0, 1, {spec(1, n)});
  owner->set_parameters(1, 0, DType::fp32, bytes_of(std::vector<float>(n, 0.5f)));
  const uint64_t base = rss_bytes(service_->pid());

  // Raw DEALERs with the stranger's key, sending without reading a single answer, as in
  // the issue: checkpoints keep the coordinator busy (each writes and syncs 24 MiB) while
  // 3 connections x 40 pushes of 8 MiB (960 MiB in all) arrive behind them.
  const std::vector<float> g(n, 1.0f);
  const auto payload = std::make_shared<std::vector<float>>(g);
  zmq::context_t ctx;
  std::vector<zmq::socket_t> sockets;
  for (int k = 0; k < 3; ++k) {
    sockets.emplace_back(ctx, zmq::socket_type::dealer);
    sockets.back().set(zmq::sockopt::linger, 0);
    security::secure_client_socket(sockets.back(), stranger());
    sockets.back().connect(service_->endpoint());
  }
  std::atomic<bool> sending{true};
  std::atomic<uint64_t> peak{0};
  std::thread watch([&] {
    while (sending) {
      peak = std::max<uint64_t>(peak, rss_bytes(service_->pid()));
      std::this_thread::sleep_for(5ms);
    }
  });
  constexpr int kCheckpoints = 4, kPushes = 40;
  uint64_t id = 1;
  for (int i = 0; i < kCheckpoints; ++i) {
    for (auto& s : sockets) {
      const msg::Header h{id++, "pushes", msg::Checkpoint{"busy", "", "ck"}};
      ASSERT_TRUE(zmq::send_multipart(s, msg::with_envelope({}, msg::encode(h))));
    }
  }
  for (int i = 0; i < kPushes; ++i) {
    for (auto& s : sockets) {
      const msg::Header h{id++, "pushes",
                          msg::PushGradients{1, 1, static_cast<uint32_t>(i), DType::fp32, n, {}}};
      auto frames = msg::with_envelope(
          {}, msg::encode(h, std::as_bytes(std::span<const float>(*payload)), payload));
      ASSERT_TRUE(zmq::send_multipart(s, frames));
    }
  }
  // Every answer (accepted, refused for ordering or pending gradients, or busy).
  size_t answers = 0, busy = 0;
  for (auto& s : sockets) {
    s.set(zmq::sockopt::rcvtimeo, 60000);
    for (int i = 0; i < kCheckpoints + kPushes; ++i) {
      std::vector<zmq::message_t> in;
      if (!zmq::recv_multipart(s, std::back_inserter(in))) break;
      ++answers;
      auto env = msg::split_envelope(in);
      ASSERT_TRUE(env);
      auto decoded = msg::decode(env->body);
      ASSERT_TRUE(decoded);
      if (const auto* e = std::get_if<msg::ErrorReply>(&decoded->header.body);
          e && e->code == ErrorCode::busy)
        ++busy;
    }
  }
  sending = false;
  watch.join();
  EXPECT_EQ(answers, 3u * (kCheckpoints + kPushes));
  EXPECT_GT(busy, 0u) << "the flood never reached the in-flight limits";
  // The in-flight bytes (48 MiB, plus one message), ZeroMQ's queues of the three
  // connections and the pushes' accumulation buffer; not the 960 MiB sent.
  EXPECT_LT(peak.load(), base + 512 * kMiB) << "VmRSS peaked at " << peak << " from " << base;
  std::printf("push flood: %zu of %zu answers busy; VmRSS %llu MiB -> peak %llu MiB\n", busy,
              answers, static_cast<unsigned long long>(base / kMiB),
              static_cast<unsigned long long>(peak.load() / kMiB));
  expect_victim_untouched();
}

TEST_F(OffloadQuotas, AClientTurnedAwayBusyRetriesAndEveryRequestGoesThrough) {
  start({"--max-requests-in-flight", "1"});
  auto c = client(stranger(), "retry");
  std::vector<msg::PartitionSpec> specs;
  for (uint64_t p = 1; p <= 8; ++p) specs.push_back(spec(p, 256 * 1024));
  c->register_partitions(0, 1, specs);
  const std::vector<float> g(256 * 1024, 0.25f);
  // Eight pushes sent back to back (one in flight is allowed), their answers collected by
  // id: the ones turned away went again.
  std::vector<uint64_t> ids;
  for (uint64_t p = 1; p <= 8; ++p)
    ids.push_back(c->send_push_gradients(p, 1, 0, DType::fp32, bytes_of(g)));
  for (uint64_t id : ids) {
    const auto r = c->receive_push_reply(id);
    EXPECT_EQ(r.step, 1u);
  }
  EXPECT_TRUE(c->commit({1, 1.0, 1.0, 1e-3}).applied);
  expect_victim_untouched();
}

}  // namespace
}  // namespace dsactor::offload::test
