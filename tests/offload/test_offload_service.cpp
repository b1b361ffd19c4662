// The real `dsactor start --role offload` process on 127.0.0.1, driven by OffloadClient
// and by a raw DEALER sending hostile messages: results against the scalar Adam
// reference, skip on overflow, restart on the same --nvme directory, a flipped byte in an
// extent, the memory limit, a commit published partition by partition after its reply,
// and a clean stop on SIGTERM.

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <cstring>

#include <fstream>
#include <zmq_addon.hpp>

#include "actors/offload_link/offload_client.h"
#include "actors/runtime/job_traffic.h"
#include "messages/offload.capnp.h"
#include "storage/metadata_store.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using actors::FetchedParameters;
using actors::OffloadClient;
using actors::OffloadError;
using msg::DType;
using msg::ErrorCode;
using namespace std::chrono_literals;

std::vector<RefPartition> setup(OffloadClient& c, std::vector<msg::PartitionSpec> specs) {
  auto reg = c.register_partitions(0, 1, specs);
  EXPECT_EQ(reg.partitions.size(), specs.size());
  std::vector<RefPartition> ref;
  for (auto& s : specs) {
    ref.emplace_back(s, random_floats(s.element_count, 11 + s.partition_id));
    c.set_parameters(s.partition_id, 0, DType::fp32, bytes_of(ref.back().master));
  }
  return ref;
}

void train(OffloadClient& c, std::vector<RefPartition>& ref, uint64_t step, int micro,
           uint32_t seed) {
  for (int k = 0; k < micro; ++k) {
    for (auto& p : ref) {
      auto g = random_floats(p.master.size(), seed++, 512.0f);
      p.accumulate(g, k == 0);
      auto r = c.push_gradients(p.spec.partition_id, step, k, DType::fp32, bytes_of(g));
      EXPECT_EQ(r.sum_squares, kernels::cpu::grad_stats(p.grad.data(), p.grad.size()).sum_squares);
    }
  }
  const msg::CommitStep commit{step, 0.25, 512.0, 2e-3};
  auto cr = c.commit(commit);
  EXPECT_TRUE(cr.applied);
  for (auto& p : ref) p.step(commit.clip_coef, commit.loss_scale, commit.lr);
}

void check(OffloadClient& c, const std::vector<RefPartition>& ref, uint64_t version) {
  for (auto& p : ref) {
    auto f32 = c.fetch(p.spec.partition_id, version, DType::fp32);
    EXPECT_EQ(f32.reply.version, version);
    expect_bits_equal(p.master, f32.bytes(), "fp32 fetch");
    expect_bf16_equal(p.master, c.fetch(p.spec.partition_id, version, DType::bf16).bytes(),
                      "bf16 fetch");
  }
}

TEST(OffloadService, TrainsLikeTheReferenceSkipsOnOverflowAndStopsCleanly) {
  TempDir tmp;
  ServiceProcess svc({}, tmp.path);
  OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
  auto ref = setup(c, {spec(10, 300000), spec(11, 4097)});
  train(c, ref, 1, 3, 1);
  check(c, ref, 1);
  train(c, ref, 2, 2, 50);
  check(c, ref, 2);

  // fp16 overflow: the push reports it, the step is skipped, nothing changes.
  std::vector<float> g(4097, 1.0f);
  g[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(c.push_gradients(11, 3, 0, DType::fp32, bytes_of(g)).nonfinite);
  auto skipped = c.skip(3);
  EXPECT_FALSE(skipped.applied);
  check(c, ref, 2);
  train(c, ref, 4, 1, 99);
  check(c, ref, 4);
  EXPECT_EQ(c.stats().steps, 3u);

  EXPECT_EQ(svc.stop(), 0);
  EXPECT_NE(svc.log().find("offload service stopped"), std::string::npos) << svc.log();
}

TEST(OffloadService, NvmeRestartServesSameStateAndCorruptionIsRefused) {
  TempDir tmp;
  const auto dir = tmp.path / "nvme";
  const auto keys = tmp.path / "keys";  // the job is the client key's across restarts
  std::vector<RefPartition> ref;
  {
    ServiceProcess svc({"--nvme", dir.string(), "--aio-block-size", "65536"}, tmp.path, keys);
    OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
    ref = setup(c, {spec(1, 100000), spec(2, 20000)});
    train(c, ref, 1, 2, 5);
    check(c, ref, 1);
    EXPECT_EQ(svc.stop(), 0);
  }
  {
    ServiceProcess svc({"--nvme", dir.string(), "--aio-block-size", "65536"}, tmp.path, keys);
    OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
    check(c, ref, 1);
    EXPECT_EQ(c.stats().partitions, 2u);
    train(c, ref, 2, 1, 8);
    check(c, ref, 2);
    EXPECT_EQ(svc.stop(), 0);
  }
  uint64_t offset;
  {
    storage::MetadataStore meta(dir / "metadata");
    offset = meta.get({"default", 1})->offset;
  }
  {
    std::fstream f(dir / "partitions.dat", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(offset + 123);
    f.put('\x5a');
  }
  ServiceProcess svc({"--nvme", dir.string(), "--aio-block-size", "65536"}, tmp.path, keys);
  OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
  try {
    c.fetch(1, 0, DType::bf16);
    ADD_FAILURE() << "a corrupt extent was served";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.code(), ErrorCode::checksumMismatch) << e.what();
  }
  expect_bits_equal(ref[1].master, c.fetch(2, 2, DType::fp32).bytes(), "intact partition");
  EXPECT_EQ(svc.stop(), 0);
}

// --workers 2 spreads a job's partitions over two workers (round-robin in registration
// order: 10 and 12 on worker 0, 11 and 13 on worker 1); every fetched byte equals the
// --workers 1 run and the scalar reference (check()).
TEST(OffloadService, TwoWorkersTrainBitIdenticalToOneWorkerAndTheReference) {
  TempDir tmp;
  std::vector<std::vector<std::byte>> first_run;
  for (const std::string workers : {"1", "2"}) {
    ServiceProcess svc({"--workers", workers}, tmp.path);
    EXPECT_NE(svc.log().find("partition workers: " + workers + ";"), std::string::npos)
        << svc.log();
    OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
    auto ref = setup(c, {spec(10, 70000), spec(11, 4097), spec(12, 30000), spec(13, 1000)});
    train(c, ref, 1, 3, 1);
    check(c, ref, 1);
    train(c, ref, 2, 2, 50);
    check(c, ref, 2);
    std::vector<std::vector<std::byte>> got;
    for (const auto& p : ref) {
      for (auto d : {DType::fp32, DType::bf16}) {
        const auto fetched = c.fetch(p.spec.partition_id, 2, d);  // owns the reply frame
        got.emplace_back(fetched.bytes().begin(), fetched.bytes().end());
      }
    }
    if (workers == "1") {
      first_run = std::move(got);
    } else {
      ASSERT_EQ(got.size(), first_run.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(got[i] == first_run[i]) << "fetch " << i << " differs from --workers 1";
      }
    }
    EXPECT_EQ(svc.stop(), 0);
  }
}

// A commit is answered once it is decided and durable; the worker then updates the job's
// partitions one by one in registration order and answers requests in between.
// DSACTOR_TEST_PAUSE_AT holds each update back, so on any machine: the first partition's
// fetch is answered while later ones are still being updated (a Ping after it still shows
// the commit's update in flight, fewer partitions done than the job has); a fetch or a push
// of a partition not updated yet waits for its update (never stale, never half-updated:
// the bytes equal the reference's); Stats sees the whole step.
TEST(OffloadService, CommitIsPublishedPartitionByPartitionAfterItsReply) {
  TempDir tmp;
  deploy::ServiceProcess svc(DSACTOR_BINARY, one_worker_pausing_updates(tmp.path, 700));
  OffloadClient c(svc.endpoint(), svc.client_security(), 30s);
  auto ref = setup(c, {spec(20, 50000), spec(21, 4097), spec(22, 3000), spec(23, 20000)});
  train(c, ref, 1, 1, 7);
  expect_bits_equal(ref[0].master, c.fetch(20, 1, DType::fp32).bytes(), "first partition");
  auto answer = c.await(c.send(msg::Ping{42}));
  ASSERT_TRUE(answer.ok());
  const auto* pong = std::get_if<msg::Pong>(&answer->header.body);
  ASSERT_NE(pong, nullptr);
  EXPECT_EQ(pong->operation, "commitStep");
  EXPECT_EQ(pong->step, 1u);
  EXPECT_EQ(pong->total, 4u);
  EXPECT_GE(pong->done, 1u);
  EXPECT_LT(pong->done, pong->total) << "the first partition was served only after the last update";
  expect_bits_equal(ref[3].master, c.fetch(23, 1, DType::fp32).bytes(), "last partition");
  // Step 2's pushes come while step 1 is still being published; its commit (and Stats)
  // only after all of it.
  train(c, ref, 2, 2, 70);
  EXPECT_EQ(c.stats().steps, 2u);
  check(c, ref, 2);
  EXPECT_EQ(svc.stop(), 0);
}

// A commit where one partition of worker 1 has a corrupt extent is refused as a whole:
// the partitions of both workers (worker 0's streamed into fresh extents in parallel)
// stay at the old version, in memory and on disk.
TEST(OffloadService, CorruptExtentOnWorkerOneLeavesBothWorkersAtTheOldVersion) {
  TempDir tmp;
  const auto dir = tmp.path / "nvme";
  const std::vector<std::string> args{"--nvme", dir.string(), "--aio-block-size",
                                      "65536",  "--workers",  "2"};
  std::vector<RefPartition> ref;
  {
    ServiceProcess svc(args, tmp.path, tmp.path / "keys");
    OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
    ref = setup(c, {spec(1, 70000), spec(2, 20000), spec(3, 50000), spec(4, 9000)});
    train(c, ref, 1, 2, 5);
    check(c, ref, 1);
    EXPECT_EQ(svc.stop(), 0);
  }
  uint64_t offset;
  {
    storage::MetadataStore meta(dir / "metadata");
    offset = meta.get({"default", 2})->offset;  // the job's second partition: worker 1
  }
  {
    std::fstream f(dir / "partitions.dat", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset + 4100);
    char ch;
    f.get(ch);
    f.seekp(offset + 4100);
    f.put(static_cast<char>(ch ^ 0x10));
  }
  auto intact = [&](OffloadClient& c) {
    for (size_t i = 0; i < ref.size(); ++i) {
      if (i == 1) continue;
      const uint64_t pid = ref[i].spec.partition_id;
      auto f32 = c.fetch(pid, 0, DType::fp32);
      EXPECT_EQ(f32.reply.version, 1u) << "partition " << pid;
      expect_bits_equal(ref[i].master, f32.bytes(), "partition kept at step 1");
      expect_bf16_equal(ref[i].master, c.fetch(pid, 0, DType::bf16).bytes(), "bf16 at step 1");
    }
  };
  {
    ServiceProcess svc(args, tmp.path, tmp.path / "keys");
    OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
    for (auto& p : ref) {
      std::vector<float> g(p.master.size(), 1.0f);
      c.push_gradients(p.spec.partition_id, 2, 0, DType::fp32, bytes_of(g));
    }
    try {
      c.commit({2, 1.0, 1.0, 1e-3});
      ADD_FAILURE() << "a commit over a corrupt extent was applied";
    } catch (const OffloadError& e) {
      EXPECT_EQ(e.code(), ErrorCode::checksumMismatch) << e.what();
      EXPECT_NE(std::string(e.what()).find("partition 2"), std::string::npos) << e.what();
    }
    intact(c);
    try {
      c.fetch(2, 0, DType::fp32);
      ADD_FAILURE() << "a corrupt extent was served";
    } catch (const OffloadError& e) {
      EXPECT_EQ(e.code(), ErrorCode::checksumMismatch) << e.what();
    }
    for (auto& p : ref) {
      try {
        c.fetch(p.spec.partition_id, 2, DType::fp32);
        ADD_FAILURE() << "partition " << p.spec.partition_id << " reached step 2";
      } catch (const OffloadError& e) {
        EXPECT_EQ(e.code(), ErrorCode::versionOrder) << e.what();
      }
    }
    EXPECT_EQ(c.stats().steps, 0u);
    EXPECT_EQ(svc.stop(), 0);
  }
  // Nothing of the refused step reached the disk either.
  ServiceProcess svc(args, tmp.path, tmp.path / "keys");
  OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
  intact(c);
  EXPECT_EQ(svc.stop(), 0);
}

// Sends frames on a raw DEALER and returns the decoded reply header (or nullopt when the
// service does not answer within 1 s, e.g. for a message it cannot route back).
std::optional<msg::Header> raw_call(zmq::socket_t& s, std::vector<zmq::message_t> frames) {
  zmq::send_multipart(s, frames);
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, 1000ms) == 0) return std::nullopt;
  std::vector<zmq::message_t> reply;
  (void)zmq::recv_multipart(s, std::back_inserter(reply));
  auto env = msg::split_envelope(reply);
  if (!env) return std::nullopt;
  auto d = msg::decode(env->body);
  if (!d) return std::nullopt;
  return d->header;
}

// Re-encodes header frame `f` after `edit` changed its Cap'n Proto fields.
template <class Edit>
zmq::message_t forge(const zmq::message_t& f, Edit edit) {
  kj::ArrayPtr<const capnp::word> words(static_cast<const capnp::word*>(f.data()),
                                        f.size() / sizeof(capnp::word));
  capnp::FlatArrayMessageReader reader(words);
  capnp::MallocMessageBuilder builder;
  builder.setRoot(reader.getRoot<msg::wire::Header>());
  edit(builder.getRoot<msg::wire::Header>());
  auto flat = capnp::messageToFlatArray(builder);
  return zmq::message_t(flat.asBytes().begin(), flat.asBytes().size());
}

std::vector<zmq::message_t> enveloped(std::vector<zmq::message_t> body) {
  return msg::with_envelope({}, std::move(body));
}

ErrorCode error_code(const std::optional<msg::Header>& h) {
  if (!h) return ErrorCode(255);
  auto* e = std::get_if<msg::ErrorReply>(&h->body);
  return e ? e->code : ErrorCode(254);
}

TEST(OffloadService, HostileMessagesAreRefusedAndServiceKeepsServing) {
  TempDir tmp;
  ServiceProcess svc({}, tmp.path);
  OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
  auto ref = setup(c, {spec(1, 5000)});

  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  security::secure_client_socket(s, svc.client_security());
  s.connect(svc.endpoint());

  // Garbage header.
  {
    std::vector<zmq::message_t> f;
    f.emplace_back(std::string("this is not capnp at all"));
    EXPECT_EQ(error_code(raw_call(s, enveloped(std::move(f)))), ErrorCode::malformed);
  }
  // Wrong frame count: a header plus four payload frames.
  {
    auto f = msg::encode(msg::Header{1, "default", msg::Stats{}});
    for (int i = 0; i < 4; ++i) f.emplace_back(std::string("x"));
    EXPECT_EQ(error_code(raw_call(s, enveloped(std::move(f)))), ErrorCode::malformed);
  }
  // Declared length far beyond the payload: a forged header claiming 2^40 elements.
  std::vector<float> g(5000, 1.0f);
  {
    auto f = msg::encode_copy(
        msg::Header{2, "default", msg::PushGradients{1, 1, 0, DType::fp32, 5000, {}}}, bytes_of(g));
    f[0] = forge(f[0], [](msg::wire::Header::Builder h) {
      h.setPayloadLength(uint64_t{1} << 42);
      h.getKind().getPushGradients().setElementCount(uint64_t{1} << 40);
    });
    const auto code = error_code(raw_call(s, enveloped(std::move(f))));
    EXPECT_TRUE(code == ErrorCode::malformed || code == ErrorCode::tooLarge) << int(code);
  }
  // Truncated payload frame.
  {
    auto f = msg::encode_copy(
        msg::Header{7, "default", msg::PushGradients{1, 1, 0, DType::fp32, 5000, {}}}, bytes_of(g));
    f[1] = zmq::message_t(f[1].data(), 100);
    EXPECT_EQ(error_code(raw_call(s, enveloped(std::move(f)))), ErrorCode::malformed);
  }
  // Payload changed after the crc was computed.
  {
    auto f = msg::encode_copy(
        msg::Header{3, "default", msg::PushGradients{1, 1, 0, DType::fp32, 5000, {}}}, bytes_of(g));
    static_cast<char*>(f[1].data())[10] ^= 1;
    EXPECT_EQ(error_code(raw_call(s, enveloped(std::move(f)))), ErrorCode::checksumMismatch);
  }
  // No delimiter at all: nothing can be routed back, the message is dropped.
  {
    std::vector<zmq::message_t> f;
    f.emplace_back(std::string("junk"));
    f.emplace_back(std::string("more junk"));
    EXPECT_FALSE(raw_call(s, std::move(f)).has_value());
  }
  // Well-formed but wrong for the service's state.
  EXPECT_EQ(
      error_code(raw_call(
          s, enveloped(msg::encode_copy(
                 msg::Header{4, "default", msg::PushGradients{99, 1, 0, DType::fp32, 5000, {}}},
                 bytes_of(g))))),
      ErrorCode::unknownPartition);
  EXPECT_EQ(
      error_code(raw_call(
          s, enveloped(msg::encode_copy(
                 msg::Header{5, "default", msg::PushGradients{1, 7, 0, DType::fp32, 5000, {}}},
                 bytes_of(g))))),
      ErrorCode::versionOrder);
  EXPECT_EQ(error_code(raw_call(
                s, enveloped(msg::encode(msg::Header{6, "default", msg::CommitStep{1, 1, 1, 1}})))),
            ErrorCode::versionOrder);
  try {
    c.push_gradients(1, 1, 3, DType::fp32, bytes_of(g));
    ADD_FAILURE() << "out-of-order micro-step accepted";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.code(), ErrorCode::versionOrder);
  }
  // Random frames of random sizes.
  std::mt19937 rng(5);
  for (int i = 0; i < 50; ++i) {
    std::vector<zmq::message_t> f;
    const int nf = 1 + rng() % 3;
    for (int k = 0; k < nf; ++k) {
      std::string b(rng() % 200, '\0');
      for (auto& ch : b) ch = static_cast<char>(rng());
      f.emplace_back(b);
    }
    zmq::send_multipart(s, enveloped(std::move(f)));
  }

  // A well-formed client is still served correctly.
  train(c, ref, 1, 2, 40);
  check(c, ref, 1);
  EXPECT_EQ(svc.stop(), 0);
}

// A service with an NVMe tier, partition 1 (`ram_n` elements) in RAM (its optimizer state
// fits under --max-in-cpu) and partition 2 (`nvme_n`) on NVMe, set up through `client`, and
// a raw DEALER on the same key for messages OffloadClient never sends.
struct TwoTierService {
  TwoTierService(const fs::path& dir, uint64_t ram_n, uint64_t nvme_n)
      : svc({"--nvme", (dir / "nvme").string(), "--aio-block-size", "64K", "--max-in-cpu",
             std::to_string(3 * ((4 * ram_n + 4095) / 4096 * 4096))},
            dir),
        client(svc.endpoint(), svc.client_security(), 20s),
        ref(setup(client, {spec(1, ram_n), spec(2, nvme_n)})),
        raw(context, zmq::socket_type::dealer) {
    EXPECT_EQ(client.stats().partitions_on_nvme, 1u);
    raw.set(zmq::sockopt::linger, 0);
    security::secure_client_socket(raw, svc.client_security());
    raw.connect(svc.endpoint());
  }
  // Elements [at, at + count) of g as a push of `micro`-step of step 1 through the raw socket
  // (count 0: the whole push); `corrupt` flips a bit after the crc was taken.
  std::optional<msg::Header> push(uint64_t pid, const std::vector<float>& g, uint32_t micro,
                                  uint64_t at, uint64_t count, bool corrupt) {
    const auto bytes = std::as_bytes(std::span(g));
    auto f = msg::encode_copy(
        msg::Header{request++, "default",
                    msg::PushGradients{pid, 1, micro, DType::fp32, g.size(), {}, at, count}},
        count == 0 ? bytes : bytes.subspan(at * sizeof(float), count * sizeof(float)));
    if (corrupt) static_cast<char*>(f[1].data())[1] ^= 1;
    return raw_call(raw, enveloped(std::move(f)));
  }
  // Commits step 1 and checks both partitions against the reference, bit for bit.
  void commit_and_check() {
    const msg::CommitStep commit{1, 0.25, 512.0, 2e-3};
    EXPECT_TRUE(client.commit(commit).applied);
    for (auto& p : ref) p.step(commit.clip_coef, commit.loss_scale, commit.lr);
    check(client, ref, 1);
  }

  ServiceProcess svc;
  OffloadClient client;
  std::vector<RefPartition> ref;
  zmq::context_t context;
  zmq::socket_t raw;
  uint64_t request = 100;
};

// The codec leaves a pushed frame's crc to the worker, which checks it inside the accumulate
// pass of a RAM partition's first micro-step and in a pass of its own otherwise: a corrupt
// payload is refused on either tier and at any micro-step, and the step goes on from what
// was summed before it.
TEST(OffloadService, CorruptPushPayloadIsRefusedOnEitherTierAndLeavesTheSum) {
  TempDir tmp;
  TwoTierService t(tmp.path, 5000, 3000);
  for (auto& p : t.ref) {
    const uint64_t pid = p.spec.partition_id;
    for (uint32_t k = 0; k < 2; ++k) {
      SCOPED_TRACE("partition " + std::to_string(pid) + ", micro-step " + std::to_string(k));
      const auto g = random_floats(p.master.size(), 30 + 2 * pid + k, 512.0f);
      EXPECT_EQ(error_code(t.push(pid, g, k, 0, 0, true)), ErrorCode::checksumMismatch);
      p.accumulate(g, k == 0);
      const auto r = t.client.push_gradients(pid, 1, k, DType::fp32, bytes_of(g));
      EXPECT_EQ(r.sum_squares, kernels::cpu::grad_stats(p.grad.data(), p.grad.size()).sum_squares);
    }
  }
  t.commit_and_check();  // nothing of the corrupt payloads reached the update
  EXPECT_EQ(t.svc.stop(), 0);
}

// A micro-step-0 push in ranges (OffloadClient::push) lands bit for bit where the same push
// sent whole would, on either tier, with ranges cut inside grad_stats' blocks or on them.
TEST(OffloadService, PushInRangesMatchesTheWholePushOnEitherTier) {
  TempDir tmp;
  TwoTierService t(tmp.path, 20000, 12000);
  OffloadClient& c = t.client;
  c.set_push_range_bytes(1000 * sizeof(float));  // not on a block: sums carry across ranges
  uint64_t sent = c.requests_sent();
  train(c, t.ref, 1, 2, 40);  // micro-step 0 in ranges, micro-step 1 whole
  EXPECT_EQ(c.requests_sent() - sent, (20 + 1) + (12 + 1) + 1) << "ranges, whole pushes, commit";
  check(c, t.ref, 1);

  c.set_push_range_bytes(4096 * sizeof(float));  // grad_stats' blocks: 5 and 3 ranges
  sent = c.requests_sent();
  train(c, t.ref, 2, 1, 50);
  EXPECT_EQ(c.requests_sent() - sent, 5 + 3 + 1);
  check(c, t.ref, 2);

  c.set_push_range_bytes(0);  // whole again
  sent = c.requests_sent();
  train(c, t.ref, 3, 1, 60);
  EXPECT_EQ(c.requests_sent() - sent, 2 + 1);
  check(c, t.ref, 3);
  EXPECT_EQ(t.svc.stop(), 0);
}

// A fetch reply asked for in parts (OffloadClient::set_fetch_part_bytes) carries the bytes a
// reply in one frame carries, split where asked, on either tier and in either dtype; a part
// size the codec does not allow is refused as malformed.
TEST(OffloadService, FetchRepliesInPartsCarryTheWholeReplysBytesOnEitherTier) {
  TempDir tmp;
  TwoTierService t(tmp.path, 20000, 12000);
  OffloadClient& c = t.client;
  train(c, t.ref, 1, 1, 70);
  for (auto& p : t.ref) {
    for (DType dtype : {DType::fp32, DType::bf16}) {
      const uint64_t pid = p.spec.partition_id;
      SCOPED_TRACE("partition " + std::to_string(pid) + ", " + std::string(msg::to_string(dtype)));
      c.set_fetch_part_bytes(0);
      const FetchedParameters whole = c.fetch(pid, 1, dtype);
      ASSERT_FALSE(whole.in_parts());
      c.set_fetch_part_bytes(4096);
      const FetchedParameters parted = c.fetch(pid, 1, dtype);
      ASSERT_TRUE(parted.in_parts());
      EXPECT_EQ(parted.reply, whole.reply);
      const size_t bytes = whole.bytes().size();
      EXPECT_EQ(parted.parts.size(), (bytes + 4095) / 4096);
      EXPECT_THROW((void)parted.bytes(), std::logic_error);
      std::vector<std::byte> joined;
      for (auto piece : parted.pieces()) {
        EXPECT_LE(piece.size(), 4096u);
        joined.insert(joined.end(), piece.begin(), piece.end());
      }
      ASSERT_EQ(joined.size(), bytes);
      EXPECT_EQ(0, std::memcmp(joined.data(), whole.bytes().data(), bytes));
      EXPECT_EQ(parted.size_bytes(), bytes);
    }
  }
  auto f = msg::encode(
      msg::Header{t.request++, "default", msg::FetchParameters{1, 1, DType::fp32, {}, 4096}});
  f[0] = forge(f[0], [](msg::wire::Header::Builder h) {
    h.getKind().getFetchParameters().setReplyPartBytes(1000);
  });
  EXPECT_EQ(error_code(raw_call(t.raw, enveloped(std::move(f)))), ErrorCode::malformed);
  EXPECT_THROW(c.set_fetch_part_bytes(1000), std::invalid_argument);
  c.set_fetch_part_bytes(8 << 20);
  check(c, t.ref, 1);  // still serving, in one frame each (smaller than a part)
  EXPECT_EQ(t.svc.stop(), 0);
}

// A fetch in ranges (OffloadClient::fetch_into over frames) hands over the bytes a whole
// reply carries, range by range in order, on either tier and in every dtype (the RAM
// partition serves bf16 as kept, fp16 converted; the NVMe one converts both), twice (the
// second time from the ranges' cached crcs). A range past the partition's end is refused as
// malformed, naming the partition's size.
TEST(OffloadService, FetchesInRangesCarryTheWholeReplysBytesOnEitherTier) {
  TempDir tmp;
  TwoTierService t(tmp.path, 20000, 12000);
  OffloadClient& c = t.client;
  train(c, t.ref, 1, 1, 71);
  for (auto& p : t.ref) {
    for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
      const uint64_t pid = p.spec.partition_id, n = p.spec.element_count;
      SCOPED_TRACE("partition " + std::to_string(pid) + ", " + std::string(msg::to_string(dtype)));
      c.set_fetch_part_bytes(0);
      const FetchedParameters whole = c.fetch(pid, 1, dtype);
      c.set_fetch_part_bytes(4096);
      const size_t range = 4096 / msg::dtype_size(dtype);
      for (int round = 0; round < 2; ++round) {
        std::vector<std::byte> joined;
        size_t ranges = 0;
        const auto sent = c.requests_sent();
        const auto head = c.fetch_into(pid, 1, dtype, n, [&](FetchedParameters&& f) {
          EXPECT_TRUE(f.reply.ranged());
          EXPECT_EQ(f.reply.range_offset, ranges * range);
          EXPECT_EQ(f.reply.range_count, std::min<uint64_t>(range, n - ranges * range));
          EXPECT_FALSE(f.in_parts());
          joined.insert(joined.end(), f.bytes().begin(), f.bytes().end());
          ++ranges;
        });
        ASSERT_TRUE(head.ok()) << head.error().message;
        EXPECT_EQ(head.value(), whole.reply) << "the whole partition's header, without a range";
        EXPECT_EQ(ranges, (n + range - 1) / range);
        EXPECT_EQ(c.requests_sent() - sent, ranges);
        ASSERT_EQ(joined.size(), whole.bytes().size());
        EXPECT_EQ(0, std::memcmp(joined.data(), whole.bytes().data(), joined.size()));
      }
    }
  }
  // Ranges as another client would ask: the last one may end at the partition's end, not
  // past it.
  msg::FetchParameters last{1, 1, DType::fp32, {}, 0};
  last.range_offset = 19990;
  last.range_count = 10;
  auto ok = raw_call(t.raw, enveloped(msg::encode(msg::Header{t.request++, "default", last})));
  ASSERT_TRUE(ok);
  ASSERT_TRUE(std::holds_alternative<msg::FetchReply>(ok->body));
  EXPECT_EQ(std::get<msg::FetchReply>(ok->body).range_count, 10u);
  msg::FetchParameters past = last;
  past.range_count = 11;
  auto refused = raw_call(t.raw, enveloped(msg::encode(msg::Header{t.request++, "default", past})));
  ASSERT_TRUE(refused);
  ASSERT_TRUE(std::holds_alternative<msg::ErrorReply>(refused->body));
  const auto& e = std::get<msg::ErrorReply>(refused->body);
  EXPECT_EQ(e.code, ErrorCode::malformed);
  EXPECT_NE(e.message.find("has 20000 elements"), std::string::npos) << e.message;
  c.set_fetch_part_bytes(8 << 20);
  check(c, t.ref, 1);  // still serving
  EXPECT_EQ(t.svc.stop(), 0);
}

// A service that admits two requests of a client at a time turns most of a window of 8
// ranges away as busy; the ranges sent again arrive after later ones, which starts the push
// over with fewer ranges at a time, and it still lands bit for bit.
TEST(OffloadService, PushInRangesGetsThroughAServiceThatAdmitsTwoRequestsAtATime) {
  TempDir tmp;
  ServiceProcess svc({"--max-requests-in-flight", "2"}, tmp.path);
  OffloadClient c(svc.endpoint(), svc.client_security(), 20s);
  auto ref = setup(c, {spec(1, 20000)});
  c.set_push_range_bytes(500 * sizeof(float));  // 40 ranges
  for (uint64_t step = 1; step <= 3; ++step) {
    const uint64_t sent = c.requests_sent();
    train(c, ref, step, 1, 90 + static_cast<uint32_t>(step));
    EXPECT_GE(c.requests_sent() - sent, 40u + 1u);
    check(c, ref, step);
  }
  EXPECT_EQ(svc.stop(), 0);
}

// The service's side of ranges, driven message by message: in order from element 0, a
// range out of order or a refused one drops the push (it starts over from element 0), only
// micro-step 0 may come in ranges, and a corrupt range is refused on either tier.
TEST(OffloadService, PushRangesGoInOrderAndARefusalStartsThePushOver) {
  TempDir tmp;
  TwoTierService t(tmp.path, 5000, 3000);
  for (auto& p : t.ref) {
    const uint64_t pid = p.spec.partition_id, n = p.master.size();
    SCOPED_TRACE("partition " + std::to_string(pid));
    auto range = [&](const std::vector<float>& g, uint64_t at, uint64_t count, uint32_t micro = 0,
                     bool corrupt = false) { return t.push(pid, g, micro, at, count, corrupt); };
    const auto g = random_floats(n, 70 + pid, 512.0f);
    const uint64_t half = n / 2;
    EXPECT_EQ(error_code(range(g, half, n - half)), ErrorCode::versionOrder);  // not first
    EXPECT_EQ(error_code(range(g, 0, half, 0, true)), ErrorCode::checksumMismatch);
    EXPECT_EQ(error_code(range(g, half, n - half)), ErrorCode::versionOrder);  // dropped
    // A good first range, then the last one out of order: the push is dropped again.
    EXPECT_EQ(error_code(range(g, 0, 1000)), ErrorCode(254));  // a PushReply
    EXPECT_EQ(error_code(range(g, 2000, n - 2000)), ErrorCode::versionOrder);
    EXPECT_EQ(error_code(range(g, 1000, 1000)), ErrorCode::versionOrder);
    // In order from element 0: the last range's reply carries the whole sum's stats.
    p.accumulate(g, true);
    EXPECT_EQ(error_code(range(g, 0, half)), ErrorCode(254));
    const auto last = range(g, half, n - half);
    ASSERT_TRUE(last.has_value());
    const auto* reply = std::get_if<msg::PushReply>(&last->body);
    ASSERT_NE(reply, nullptr);
    EXPECT_EQ(reply->sum_squares,
              kernels::cpu::grad_stats(p.grad.data(), p.grad.size()).sum_squares);
    // Micro-step 1 comes whole, never in ranges.
    const auto g1 = random_floats(n, 80 + pid, 512.0f);
    EXPECT_EQ(error_code(range(g1, 0, half, 1)), ErrorCode::malformed);
    p.accumulate(g1, false);
    (void)t.client.push_gradients(pid, 1, 1, DType::fp32, bytes_of(g1));
  }
  t.commit_and_check();
  EXPECT_EQ(t.svc.stop(), 0);
}

// The gateway's per-job figures count a push in ranges once, as its sender does, and all
// of its bytes.
TEST(OffloadService, TrafficCountsAPushInRangesOnceWithAllItsBytes) {
  const std::vector<std::byte> payload(3000 * sizeof(float));
  actors::JobTraffic traffic;
  auto count = [&](uint64_t at, uint64_t n) {
    msg::Message m;
    m.header = msg::Header{1, "j", msg::PushGradients{1, 1, 0, DType::fp32, 3000, {}, at, n}};
    m.payload = std::span(payload).first((n == 0 ? 3000 : n) * sizeof(float));
    traffic.count(m);
  };
  count(0, 1000);
  count(1000, 1000);
  count(2000, 1000);
  count(0, 0);  // the same push whole
  const auto f = traffic.by_job().at("j");
  EXPECT_EQ(f.pushes, 2u);
  EXPECT_EQ(f.pushed_frame_bytes, 2 * 3000 * sizeof(float));
}

TEST(OffloadService, MemoryLimitRefusalNamesAskedAndFree) {
  TempDir tmp;
  ServiceProcess svc({"--memory-limit", "1M"}, tmp.path);
  OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
  auto ref = setup(c, {spec(1, 20000)});
  try {
    c.register_partitions(0, 1, {spec(2, 1 << 20)});
    ADD_FAILURE() << "registration beyond the limit accepted";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.code(), ErrorCode::outOfMemory);
    EXPECT_NE(std::string(e.what()).find("asks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.stats().partitions, 1u);
  train(c, ref, 1, 1, 3);
  check(c, ref, 1);
  EXPECT_EQ(svc.stop(), 0);
}

// Pipelined pushes (what the ZeRO engine does on its last micro-step): several requests
// in flight on one socket, a round trip in between, replies collected in another order
// than sent, each matched to its request by id; the step then equals the reference.
TEST(OffloadClient, PipelinedPushesAreCollectedByRequestId) {
  TempDir tmp;
  ServiceProcess svc({"--workers", "2"}, tmp.path);  // two workers may answer out of order
  OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
  auto ref = setup(c, {spec(20, 70000), spec(21, 5000), spec(22, 33000)});
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < ref.size(); ++i) {
    auto g = random_floats(ref[i].master.size(), 300 + static_cast<uint32_t>(i), 512.0f);
    ref[i].accumulate(g, true);
    ids.push_back(c.send_push_gradients(ref[i].spec.partition_id, 1, 0, DType::fp32,
                                        bytes_of(g)));  // copied: g may go now
  }
  EXPECT_EQ(c.outstanding(), 3u);
  EXPECT_EQ(c.stats().partitions, 3u);  // a round trip while the pushes are outstanding
  for (size_t i = ref.size(); i-- > 0;) {
    const auto r = c.receive_push_reply(ids[i]);
    EXPECT_EQ(r.sum_squares,
              kernels::cpu::grad_stats(ref[i].grad.data(), ref[i].grad.size()).sum_squares)
        << "partition " << ref[i].spec.partition_id;
  }
  EXPECT_EQ(c.outstanding(), 0u);
  EXPECT_THROW(c.receive(ids[0]), std::logic_error);  // already collected
  const msg::CommitStep commit{1, 0.5, 512.0, 1e-3};
  EXPECT_TRUE(c.commit(commit).applied);
  for (auto& p : ref) p.step(commit.clip_coef, commit.loss_scale, commit.lr);
  check(c, ref, 1);
  // An abandoned request's reply is skipped by the next call.
  std::vector<float> g(5000, 0.5f);
  c.abandon(c.send_push_gradients(21, 2, 0, DType::fp32, bytes_of(g)));
  EXPECT_EQ(c.stats().partitions, 3u);
  EXPECT_EQ(c.outstanding(), 0u);
  EXPECT_EQ(svc.stop(), 0);
}

TEST(OffloadClient, PipelinedReceiveTimeoutNamesTheEndpointAndRequest) {
  OffloadClient c("tcp://127.0.0.1:1", kInsecure, 200ms);
  std::vector<float> g(16, 1.0f);
  const uint64_t id = c.send_push_gradients(1, 1, 0, DType::fp32, bytes_of(g));
  try {
    c.receive_push_reply(id);
    ADD_FAILURE() << "no timeout";
  } catch (const actors::OffloadTimeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("tcp://127.0.0.1:1"), std::string::npos) << what;
    EXPECT_NE(what.find("pushGradients"), std::string::npos) << what;
  }
  EXPECT_EQ(c.outstanding(), 0u);  // a reply that still came would be discarded
}

TEST(OffloadClient, TimeoutNamesTheEndpoint) {
  OffloadClient c("tcp://127.0.0.1:1", kInsecure, 200ms);
  try {
    c.stats();
    ADD_FAILURE() << "no timeout";
  } catch (const actors::OffloadTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("tcp://127.0.0.1:1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsactor::offload::test
