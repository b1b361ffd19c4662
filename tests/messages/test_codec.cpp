// Wire codec: round trips of every kind, zero-copy payloads, every malformed class, and a
// real ROUTER/DEALER loopback over tcp.

#include <capnp/any.h>
#include <capnp/message.h>
#include <capnp/orphan.h>
#include <capnp/schema.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "checksum/crc32c.h"
#include "messages/codec.h"
#include "messages/offload.capnp.h"

namespace dsactor::messages {
namespace {

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
  return v;
}

std::vector<std::byte> frame_bytes(const zmq::message_t& m) {
  const auto* p = static_cast<const std::byte*>(m.data());
  return {p, p + m.size()};
}

// One header of every kind, with non-default values in every field so a field the codec
// forgets shows up as a mismatch.
std::vector<Header> every_kind() {
  OptimizerConfig opt{OptimizerKind::adam, 3e-4, 0.85, 0.95, 1e-6, 0.1, false};
  std::vector<PartitionVersion> versions{{7, 3}, {1ull << 40, 12}};
  std::vector<Header> h;
  auto add = [&](Body b) {
    h.push_back(Header{100 + h.size(), "job-" + std::to_string(h.size()), std::move(b)});
  };
  add(Register{3,
               8,
               {PartitionSpec{11, 1024, DType::fp32, DType::bf16, opt},
                PartitionSpec{12, 2048, DType::fp32, DType::fp16, OptimizerConfig{}}},
               true});
  add(RegisterReply{"offload-0@host", versions, 41, std::string("rec\0ord", 7), true});
  add(SetParameters{11, 0, DType::fp32, 256});
  add(SetParametersReply{11, 0});
  add(PushGradients{11, 5, 2, DType::bf16, 512, {}});
  add(PushReply{11, 5, 2, 12.5, true});
  add(CommitStep{5, 0.5, 65536.0, 1e-4, "{\"v\":1}"});
  add(CommitStep{7, 1.0, 1.0, 1e-3, "", true});
  add(SkipStep{6, "skip-record"});
  add(CommitReply{5, false, versions});
  add(FetchParameters{11, 4, DType::fp16, {}});
  add(FetchReply{11, 5, DType::fp16, 300, {}});
  add(Stats{});
  add(StatsReply{1ull << 33, 1ull << 36, 48, 1000, "mlock", 40, 8, NvmeTier::kPresent,
                 "/mnt/nvme"});
  add(StatsReply{1, 0, 1, 2, "none", 1, 0, NvmeTier::kAbsent, ""});
  add(Checkpoint{"step1000", "", "run/service-0"});
  add(CheckpointReply{"step1000", 1000, 123456789, "/state/checkpoints/key-ab/job/run"});
  add(Restore{"step1000", "", "run/service-0"});
  add(RestoreReply{"step1000", 1000, versions});
  add(Ping{0xdeadbeef});
  add(Pong{0xdeadbeef});
  add(Pong{7, "commit", 12, 37, 96, 30000});
  add(ErrorReply{ErrorCode::versionOrder, "step 4 < committed 5"});
  add(MapArena{"", 1ull << 30, "0123abcd"});
  add(MapArenaReply{3, 1ull << 30, "0123abcd", "@dsactor-offload-1-ab"});
  add(MapArenaReply{4, 1ull << 20, "", "", true});
  add(UnmapArena{3});
  add(UnmapArenaReply{3});
  add(DropJob{});
  add(DropJobReply{12, 1ull << 33});
  add(DeleteCheckpoint{"rank-0/global_step20"});
  add(DeleteCheckpointReply{1ull << 34});
  add(ErrorReply{ErrorCode::permissionDenied, "the job belongs to another client key"});
  add(ErrorReply{ErrorCode::busy, "retry"});
  // The payload kinds with their bytes in a shared-memory arena instead of frame 1.
  add(PushGradients{11, 5, 2, DType::bf16, 512, ArenaSlice{3, 4096, 1024, 0xabcdef01}});
  add(FetchParameters{11, 4, DType::fp16, ArenaSlice{3, 8192, 1 << 20, 0}});
  add(PushGradients{11, 5, 3, DType::fp32, 256, ArenaSlice{3, 0, 1024, 0, true}});
  add(FetchParameters{11, 4, DType::fp32, ArenaSlice{3, 8192, 1 << 20, 0, true}});
  add(FetchParameters{11, 4, DType::fp32, {}, 8 << 20});
  add(FetchReply{11, 5, DType::fp32, 150, ArenaSlice{3, 8192, 600, 0, true}});
  add(FetchReply{11, 5, DType::fp16, 300, ArenaSlice{3, 8192, 600, 0x12345678}});
  // A range of a push sent in ranges: the payload is the range, as a frame or a slice.
  add(PushGradients{11, 5, 0, DType::bf16, 4096, {}, 1024, 2048});
  add(PushGradients{11, 5, 0, DType::fp32, 4096, ArenaSlice{3, 0, 8192, 0, true}, 2048, 2048});
  // A push slot lent to the service until the commit, kept, and the update written into it.
  add(PushGradients{11, 5, 0, DType::fp32, 256, ArenaSlice{3, 0, 1024, 0, true}, 0, 0, true});
  add(PushReply{11, 5, 0, 2.25, false, true});
  // The optimizer step asked for in the push, and its reply saying it ran.
  {
    PushGradients g{11, 5, 0, DType::fp32, 256, ArenaSlice{3, 0, 1024, 0, true}};
    g.update_at_push = true;
    g.update_lr = 6e-4;
    add(g);
    add(PushReply{11, 5, 0, 2.25, false, false, true});
  }
  // A lent push with the trainer's stats of its gradient, finite and not.
  for (const PushedStats st :
       {PushedStats{2.25, false}, PushedStats{std::numeric_limits<double>::infinity(), true}}) {
    PushGradients g{11, 5, 0, DType::fp32, 256, ArenaSlice{3, 0, 1024, 0, true}, 0, 0, true};
    g.given_stats = st;
    add(g);
  }
  add(CommitReply{5, true, versions, true});
  // Answered after the update: the views the updated masters are in.
  add(CommitReply{5, true, versions, true, {{7, 0x8000000000000001ull}, {1ull << 40, 2}}});
  // A range of a fetch sent in ranges, and its reply carrying that range.
  {
    FetchParameters f{11, 4, DType::bf16, {}, 0};
    f.range_offset = 4096;
    f.range_count = 2048;
    add(f);
    FetchReply r{11, 5, DType::bf16, 10000, {}};
    r.range_offset = 8192;
    r.range_count = 1808;
    add(r);
  }
  // A fetch that would map the master read-only, holding view 7; replies naming a view
  // with its ticket, and the view held (no ticket).
  {
    FetchParameters f{11, 4, DType::fp32, ArenaSlice{3, 8192, 1 << 20, 0, true}};
    f.accept_master_view = true;
    f.held_view = 7;
    add(f);
    FetchReply r{11, 5, DType::fp32, 150, {}};
    r.master_view = MasterView{8, std::string(64, 'a'), "@dsactor-offload-1-ab"};
    add(r);
    r.master_view = MasterView{7, "", ""};
    add(r);
  }
  return h;
}

size_t payload_bytes(const Header& h) {
  auto shape = payload_shape(h.body);
  return shape ? shape->second * dtype_size(shape->first) : 0;
}

std::vector<zmq::message_t> encode_any(const Header& h, const std::vector<std::byte>& payload) {
  return has_payload(h.body) ? encode_copy(h, payload) : encode(h);
}

TEST(Codec, EveryKindRoundTrips) {
  std::set<size_t> kinds;
  for (const Header& h : every_kind()) {
    SCOPED_TRACE(std::string(kind_name(h.body)));
    kinds.insert(h.body.index());
    const auto payload = random_bytes(payload_bytes(h), static_cast<uint32_t>(h.request_id));
    auto frames = encode_any(h, payload);
    ASSERT_EQ(frames.size(), has_payload(h.body) ? 2u : 1u);

    auto msg = decode(frames);
    ASSERT_TRUE(msg.ok()) << msg.error().message;
    EXPECT_EQ(msg->header, h);
    EXPECT_TRUE(
        std::equal(msg->payload.begin(), msg->payload.end(), payload.begin(), payload.end()));
    if (has_payload(h.body)) {
      EXPECT_EQ(msg->payload_crc32c, checksum::crc32c(payload.data(), payload.size()));
      EXPECT_EQ(msg->payload.data(), frames[1].data());  // a view, not a copy
    }
  }
  EXPECT_EQ(kinds.size(), std::variant_size_v<Body>) << "every_kind() misses a kind";
}

TEST(Codec, DefaultsAndEmptyPayloadRoundTrip) {
  // Zero-length payloads still travel as an (empty) frame 1.
  Header h{0, "", PushGradients{0, 0, 0, DType::fp32, 0, {}}};
  auto frames = encode_copy(h, {});
  ASSERT_EQ(frames.size(), 2u);
  auto msg = decode(frames);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  EXPECT_EQ(msg->header, h);
  EXPECT_TRUE(msg->payload.empty());

  auto owner = std::make_shared<int>(0);
  auto zc = encode(h, {}, owner);
  ASSERT_TRUE(decode(zc).ok());
}

TEST(Codec, ZeroCopyPayloadKeepsOwnerAlive) {
  auto buffer = std::make_shared<std::vector<std::byte>>(random_bytes(64 * 1024, 1));
  std::weak_ptr<std::vector<std::byte>> watch = buffer;
  const std::byte* source = buffer->data();
  Header h{9, "job", FetchReply{4, 2, DType::bf16, 32 * 1024, {}}};

  auto frames = encode(h, std::span<const std::byte>(*buffer), buffer);
  EXPECT_EQ(frames[1].data(), static_cast<const void*>(source));
  buffer.reset();
  EXPECT_FALSE(watch.expired()) << "the frame must keep the payload alive";

  auto msg = decode(frames);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  EXPECT_EQ(msg->payload.data(), source);
  EXPECT_EQ(msg->payload_crc32c, checksum::crc32c(source, 64 * 1024));

  frames.clear();
  EXPECT_TRUE(watch.expired()) << "releasing the frame must release the owner";
}

TEST(Codec, FetchReplyInPartsRoundTrips) {
  // 10000 bf16 elements in parts of 4096 bytes: 4 full parts and one of 3616.
  auto buffer = std::make_shared<std::vector<std::byte>>(random_bytes(20000, 3));
  std::weak_ptr<std::vector<std::byte>> watch = buffer;
  const std::byte* source = buffer->data();
  Header h{9, "job", FetchReply{4, 2, DType::bf16, 10000, {}}};
  auto frames = encode(h, std::span<const std::byte>(*buffer), buffer, std::nullopt, 4096);
  ASSERT_EQ(frames.size(), 6u);
  for (size_t i = 1; i < frames.size(); ++i) {
    EXPECT_EQ(frames[i].data(), static_cast<const void*>(source + (i - 1) * 4096)) << i;
    EXPECT_EQ(frames[i].size(), i < 5 ? 4096u : 20000u - 4 * 4096u) << i;
  }
  buffer.reset();
  EXPECT_FALSE(watch.expired()) << "the parts must keep the payload alive";

  auto msg = decode(frames);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  EXPECT_EQ(msg->header, h);
  EXPECT_TRUE(msg->payload.empty());
  ASSERT_EQ(msg->payload_parts.size(), 5u);
  std::vector<std::byte> joined;
  for (auto part : msg->payload_parts) joined.insert(joined.end(), part.begin(), part.end());
  ASSERT_EQ(joined.size(), 20000u);
  EXPECT_EQ(0, std::memcmp(joined.data(), source, joined.size()));
  EXPECT_EQ(msg->payload_crc32c, checksum::crc32c(source, 20000));

  // The last part released keeps the others' owner alive; all released, it goes.
  frames.pop_back();
  EXPECT_FALSE(watch.expired());
  frames.clear();
  EXPECT_TRUE(watch.expired()) << "releasing every part must release the owner";

  // A payload no larger than a part stays one frame.
  auto small = std::make_shared<std::vector<std::byte>>(random_bytes(4096, 4));
  auto single = encode(Header{9, "job", FetchReply{4, 2, DType::bf16, 2048, {}}},
                       std::span<const std::byte>(*small), small, std::nullopt, 4096);
  EXPECT_EQ(single.size(), 2u);
}

TEST(Codec, KnownChecksumIsSentAsGiven) {
  const auto payload = random_bytes(1024, 2);
  Header h{1, "job", SetParameters{1, 0, DType::fp32, 256}};
  const uint32_t good = checksum::crc32c(payload.data(), payload.size());
  ASSERT_TRUE(decode(encode_copy(h, payload, good)).ok());
  // A stale stored checksum is the receiver's to catch: end-to-end integrity.
  auto bad = decode(encode_copy(h, payload, good ^ 1u));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, DecodeErrc::checksumMismatch);
}

TEST(Codec, EncodeRejectsProgrammingErrors) {
  const auto payload = random_bytes(64, 3);
  auto owner = std::make_shared<int>(0);
  EXPECT_THROW(encode(Header{1, "j", Stats{}}, payload, owner), std::invalid_argument);
  EXPECT_THROW(encode(Header{1, "j", PushGradients{1, 1, 0, DType::fp32, 16, {}}}),
               std::invalid_argument);
  EXPECT_THROW(encode_copy(Header{1, "j", PushGradients{1, 1, 0, DType::fp32, 15, {}}}, payload),
               std::invalid_argument);
  EXPECT_THROW(
      encode(Header{1, "j", PushGradients{1, 1, 0, DType::fp32, 16, {}}}, payload, nullptr),
      std::invalid_argument);
  EXPECT_THROW(encode(Header{1, std::string("a\0b", 3), Stats{}}), std::invalid_argument);
  // Huge count whose byte size wraps around 2^64 to the real payload size.
  EXPECT_THROW(
      encode_copy(Header{1, "j", PushGradients{1, 1, 0, DType::fp32, (1ull << 62) + 16, {}}},
                  payload),
      std::invalid_argument);
  // Parts: a fetch reply's only, of at least kMinPayloadPartBytes, a multiple of 8.
  auto owned = std::make_shared<std::vector<std::byte>>(random_bytes(8192, 5));
  const std::span<const std::byte> bytes(*owned);
  EXPECT_THROW(encode(Header{1, "j", SetParameters{1, 0, DType::fp32, 2048}}, bytes, owned,
                      std::nullopt, 4096),
               std::invalid_argument);
  const Header reply{1, "j", FetchReply{1, 0, DType::fp32, 2048, {}}};
  EXPECT_THROW(encode(reply, bytes, owned, std::nullopt, 1024), std::invalid_argument);
  EXPECT_THROW(encode(reply, bytes, owned, std::nullopt, 4100), std::invalid_argument);
  EXPECT_EQ(encode(reply, bytes, owned, std::nullopt, 4096).size(), 3u);
}

// ---- malformed input ------------------------------------------------------------------

// Raw capnp header, for the cases encode() refuses to produce.
template <class Fill>
zmq::message_t forged(Fill fill, uint64_t payload_length = 0, uint32_t crc = 0) {
  capnp::MallocMessageBuilder b;
  auto h = b.initRoot<wire::Header>();
  h.setSchemaVersion(kSchemaVersion);
  h.setRequestId(1);
  h.setJobId("job");
  h.setPayloadLength(payload_length);
  h.setPayloadCrc32c(crc);
  fill(h);
  auto flat = capnp::messageToFlatArray(b);
  return zmq::message_t(flat.asBytes().begin(), flat.asBytes().size());
}

DecodeErrc error_of(std::span<const zmq::message_t> frames, const Limits& limits = {}) {
  auto r = decode(frames, limits);
  EXPECT_FALSE(r.ok()) << "decoded a malformed message";
  if (r.ok()) return DecodeErrc::badField;  // any value; the EXPECT above already failed
  EXPECT_FALSE(r.error().message.empty());
  return r.error().code;
}

std::vector<zmq::message_t> one(zmq::message_t m) {
  std::vector<zmq::message_t> v;
  v.push_back(std::move(m));
  return v;
}

std::vector<zmq::message_t> two(zmq::message_t a, const std::vector<std::byte>& payload) {
  std::vector<zmq::message_t> v;
  v.push_back(std::move(a));
  v.emplace_back(payload.data(), payload.size());
  return v;
}

TEST(CodecMalformed, TruncatedHeader) {
  auto good = encode(every_kind()[0]);  // Register: a multi-word header
  const auto bytes = frame_bytes(good[0]);
  ASSERT_GE(bytes.size(), 64u);
  for (size_t cut : {size_t{0}, size_t{4}, size_t{8}, size_t{16}, bytes.size() / 2,
                     bytes.size() - 8, bytes.size() - 1}) {
    SCOPED_TRACE(cut);
    auto frames = one(zmq::message_t(bytes.data(), cut));
    EXPECT_EQ(error_of(frames), DecodeErrc::badHeader);
  }
}

TEST(CodecMalformed, TrailingBytesAfterHeader) {
  auto bytes = frame_bytes(encode(Header{1, "j", Ping{1}})[0]);
  bytes.resize(bytes.size() + 8);
  EXPECT_EQ(error_of(one(zmq::message_t(bytes.data(), bytes.size()))), DecodeErrc::badHeader);
}

TEST(CodecMalformed, GarbageBytes) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    auto bytes = random_bytes(8 * (1 + seed % 40), seed);
    auto frames = one(zmq::message_t(bytes.data(), bytes.size()));
    auto r = decode(frames);
    EXPECT_FALSE(r.ok()) << "seed " << seed;  // random words never form a valid Header
  }
  std::vector<std::byte> ff(256, std::byte{0xFF});
  EXPECT_EQ(error_of(one(zmq::message_t(ff.data(), ff.size()))), DecodeErrc::badHeader);
}

TEST(CodecMalformed, WrongFrameCount) {
  EXPECT_EQ(error_of({}), DecodeErrc::wrongFrameCount);

  const auto payload = random_bytes(64, 4);
  Header push{1, "j", PushGradients{1, 1, 0, DType::fp32, 16, {}}};
  auto frames = encode_copy(push, payload);
  EXPECT_EQ(error_of(std::span(frames).first(1)), DecodeErrc::wrongFrameCount);
  frames.emplace_back(payload.data(), payload.size());
  EXPECT_EQ(error_of(frames), DecodeErrc::wrongFrameCount);

  auto stats = encode(Header{1, "j", Stats{}});
  stats.emplace_back(payload.data(), payload.size());
  EXPECT_EQ(error_of(stats), DecodeErrc::wrongFrameCount);
}

TEST(CodecMalformed, PayloadParts) {
  auto reply = [](wire::DType dtype, uint64_t count) {
    return [=](wire::Header::Builder h) {
      auto r = h.getKind().initFetchReply();
      r.setDtype(dtype);
      r.setElementCount(count);
    };
  };
  const auto payload = random_bytes(96, 10);
  const uint32_t crc = checksum::crc32c(payload.data(), payload.size());
  auto parts = [&](zmq::message_t head, std::vector<size_t> sizes) {
    std::vector<zmq::message_t> v;
    v.push_back(std::move(head));
    size_t at = 0;
    for (size_t n : sizes) {
      v.emplace_back(payload.data() + at, n);
      at += n;
    }
    return v;
  };
  ASSERT_TRUE(decode(parts(forged(reply(wire::DType::FP32, 24), 96, crc), {32, 32, 32})).ok());
  // A part that splits an element.
  EXPECT_EQ(error_of(parts(forged(reply(wire::DType::FP32, 24), 96, crc), {30, 34, 32})),
            DecodeErrc::lengthMismatch);
  // Parts that do not add up to the declared length.
  EXPECT_EQ(error_of(parts(forged(reply(wire::DType::FP32, 24), 96, crc), {32, 32})),
            DecodeErrc::lengthMismatch);
  // A flipped byte in a later part.
  auto corrupt = parts(forged(reply(wire::DType::FP32, 24), 96, crc), {32, 32, 32});
  static_cast<std::byte*>(corrupt[3].data())[5] ^= std::byte{1};
  EXPECT_EQ(error_of(corrupt), DecodeErrc::checksumMismatch);
  // Parts above the payload limit, counted as they add up.
  Limits limits;
  limits.max_payload_bytes = 64;
  EXPECT_EQ(error_of(parts(forged(reply(wire::DType::FP32, 24), 96, crc), {32, 32, 32}), limits),
            DecodeErrc::tooLarge);
  // Only a fetch reply comes in parts.
  auto set = [](wire::Header::Builder h) {
    auto s = h.getKind().initSetParameters();
    s.setDtype(wire::DType::FP32);
    s.setElementCount(24);
  };
  EXPECT_EQ(error_of(parts(forged(set, 96, crc), {32, 64})), DecodeErrc::wrongFrameCount);

  // A request may ask for parts of 0 (one frame) or of >= 4096 bytes, a multiple of 8.
  auto asking = [](uint64_t part) {
    return [=](wire::Header::Builder h) {
      auto f = h.getKind().initFetchParameters();
      f.setDtype(wire::DType::FP32);
      f.setReplyPartBytes(part);
    };
  };
  EXPECT_TRUE(decode(one(forged(asking(0)))).ok());
  EXPECT_TRUE(decode(one(forged(asking(4096)))).ok());
  for (uint64_t bad : {uint64_t{1}, uint64_t{4088}, uint64_t{4100}}) {
    auto r = decode(one(forged(asking(bad))));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, DecodeErrc::badField);
    EXPECT_NE(r.error().message.find("replyPartBytes"), std::string::npos) << r.error().message;
  }
}

TEST(CodecMalformed, PushUpdateNeedsAFiniteLr) {
  auto asking = [](bool update, double lr) {
    return [=](wire::Header::Builder h) {
      auto p = h.getKind().initPushGradients();
      p.setDtype(wire::DType::FP32);
      p.setElementCount(16);
      p.setUpdateAtPush(update);
      p.setUpdateLr(lr);
    };
  };
  const auto payload = random_bytes(64, 9);
  const uint32_t crc = checksum::crc32c(payload.data(), payload.size());
  EXPECT_TRUE(decode(two(forged(asking(true, 1e-3), 64, crc), payload)).ok());
  EXPECT_TRUE(decode(two(forged(asking(true, 0.0), 64, crc), payload)).ok());
  // Without updateAtPush the lr is not read.
  EXPECT_TRUE(decode(two(forged(asking(false, -1.0), 64, crc), payload)).ok());
  for (double bad :
       {-1e-3, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    auto r = decode(two(forged(asking(true, bad), 64, crc), payload));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, DecodeErrc::badField);
    EXPECT_NE(r.error().message.find("pushGradients.updateLr"), std::string::npos)
        << r.error().message;
  }
}

TEST(CodecMalformed, PushStatsMustBeASumOfSquares) {
  auto giving = [](double sum_squares, bool nonfinite) {
    return [=](wire::Header::Builder h) {
      auto p = h.getKind().initPushGradients();
      p.setDtype(wire::DType::FP32);
      p.setElementCount(16);
      auto st = p.initGivenStats();
      st.setSumSquares(sum_squares);
      st.setNonfinite(nonfinite);
    };
  };
  const auto payload = random_bytes(64, 9);
  const uint32_t crc = checksum::crc32c(payload.data(), payload.size());
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [s, nonfinite] :
       std::vector<std::pair<double, bool>>{{0.0, false}, {3.5, false}, {inf, true}, {nan, true}}) {
    auto r = decode(two(forged(giving(s, nonfinite), 64, crc), payload));
    ASSERT_TRUE(r.ok()) << s << " " << nonfinite << ": " << r.error().message;
    const auto& g = std::get<PushGradients>(r->header.body);
    ASSERT_TRUE(g.given_stats);
    EXPECT_EQ(g.given_stats->nonfinite, nonfinite);
  }
  // Negative, finite but called nonfinite, or not finite but called finite.
  for (const auto& [s, nonfinite] : std::vector<std::pair<double, bool>>{
           {-1.0, false}, {-inf, true}, {2.0, true}, {inf, false}, {nan, false}}) {
    auto r = decode(two(forged(giving(s, nonfinite), 64, crc), payload));
    ASSERT_FALSE(r.ok()) << s << " " << nonfinite;
    EXPECT_EQ(r.error().code, DecodeErrc::badField);
    EXPECT_NE(r.error().message.find("pushGradients.givenStats"), std::string::npos)
        << r.error().message;
  }
}

TEST(CodecMalformed, PushRangeOutsideThePartition) {
  auto range = [](uint64_t offset, uint64_t count) {
    return [=](wire::Header::Builder h) {
      auto p = h.getKind().initPushGradients();
      p.setDtype(wire::DType::FP32);
      p.setElementCount(100);
      p.setRangeOffset(offset);
      p.setRangeCount(count);
    };
  };
  const auto payload = random_bytes(64, 9);
  const uint32_t crc = checksum::crc32c(payload.data(), payload.size());
  EXPECT_TRUE(decode(two(forged(range(84, 16), 64, crc), payload)).ok());
  EXPECT_EQ(error_of(two(forged(range(85, 16), 64, crc), payload)), DecodeErrc::badField);
  EXPECT_EQ(error_of(two(forged(range(101, 16), 64, crc), payload)), DecodeErrc::badField);
  // An offset near 2^64 whose end would wrap around into the partition.
  EXPECT_EQ(error_of(two(forged(range(~uint64_t{0} - 7, 16), 64, crc), payload)),
            DecodeErrc::badField);
  // An offset without a range.
  EXPECT_EQ(error_of(two(forged(range(4, 0), 64, crc), payload)), DecodeErrc::badField);
  // The frame holds the range, not the partition.
  EXPECT_EQ(error_of(two(forged(range(0, 15), 64, crc), payload)), DecodeErrc::lengthMismatch);
}

TEST(CodecMalformed, FetchRangeOutsideThePartition) {
  auto range = [](uint64_t offset, uint64_t count) {
    return [=](wire::Header::Builder h) {
      auto r = h.getKind().initFetchReply();
      r.setDtype(wire::DType::FP32);
      r.setElementCount(100);
      r.setRangeOffset(offset);
      r.setRangeCount(count);
    };
  };
  const auto payload = random_bytes(64, 10);
  const uint32_t crc = checksum::crc32c(payload.data(), payload.size());
  EXPECT_TRUE(decode(two(forged(range(84, 16), 64, crc), payload)).ok());
  EXPECT_EQ(error_of(two(forged(range(85, 16), 64, crc), payload)), DecodeErrc::badField);
  EXPECT_EQ(error_of(two(forged(range(~uint64_t{0} - 7, 16), 64, crc), payload)),
            DecodeErrc::badField);
  EXPECT_EQ(error_of(two(forged(range(4, 0), 64, crc), payload)), DecodeErrc::badField);
  // The frame holds the range, not the partition.
  EXPECT_EQ(error_of(two(forged(range(0, 15), 64, crc), payload)), DecodeErrc::lengthMismatch);
  // A request: the partition's size is the service's to check, but not a range that wraps
  // around or an offset without a range.
  auto request = [](uint64_t offset, uint64_t count) {
    return [=](wire::Header::Builder h) {
      auto f = h.getKind().initFetchParameters();
      f.setDtype(wire::DType::FP32);
      f.setRangeOffset(offset);
      f.setRangeCount(count);
    };
  };
  EXPECT_TRUE(decode(one(forged(request(1ull << 40, 16), 0, 0))).ok());
  EXPECT_EQ(error_of(one(forged(request(~uint64_t{0} - 7, 16), 0, 0))), DecodeErrc::badField);
  EXPECT_EQ(error_of(one(forged(request(4, 0), 0, 0))), DecodeErrc::badField);
}

// A master view only for a whole fp32 partition without an arena slice, never view 0, with
// a ticket a hand-over can carry and an abstract socket name.
TEST(CodecMalformed, MasterViews) {
  auto reply = [](wire::DType dtype, uint64_t view, std::string ticket, std::string socket,
                  uint64_t range, bool arena) {
    return [=](wire::Header::Builder h) {
      auto r = h.getKind().initFetchReply();
      r.setDtype(dtype);
      r.setElementCount(100);
      if (range) r.setRangeCount(range);
      if (arena) {
        auto a = r.initArena();
        a.setArenaId(1);
        a.setLength(range ? range * 4 : 400);
        a.setCrcOmitted(true);
      }
      auto v = r.initMasterView();
      v.setViewId(view);
      v.setTicket(ticket);
      v.setSocket(socket);
    };
  };
  const std::string t(64, 'a');
  EXPECT_TRUE(decode(one(forged(reply(wire::DType::FP32, 3, t, "@door", 0, false), 0, 0))).ok());
  EXPECT_TRUE(decode(one(forged(reply(wire::DType::FP32, 3, "", "", 0, false), 0, 0))).ok());
  for (auto bad : {reply(wire::DType::FP32, 0, t, "@door", 0, false),
                   reply(wire::DType::BF16, 3, t, "@door", 0, false),
                   reply(wire::DType::FP32, 3, t, "@door", 10, false),
                   reply(wire::DType::FP32, 3, t, "@door", 0, true),
                   reply(wire::DType::FP32, 3, std::string(257, 'a'), "@door", 0, false),
                   reply(wire::DType::FP32, 3, t, "/tmp/door", 0, false),
                   reply(wire::DType::FP32, 3, t, "@" + std::string(107, 'd'), 0, false)})
    EXPECT_EQ(error_of(one(forged(bad, 0, 0))), DecodeErrc::badField);
}

// A commit reply's current view names a view id, never 0 (as a fetch reply's master view).
TEST(CodecMalformed, CommitReplyCurrentViews) {
  auto reply = [](uint64_t view) {
    return [=](wire::Header::Builder h) {
      auto r = h.getKind().initCommitReply();
      r.setStep(5);
      r.setApplied(true);
      auto v = r.initCurrentViews(2);
      v[0].setPartitionId(1);
      v[0].setViewId(9);
      v[1].setPartitionId(2);
      v[1].setViewId(view);
    };
  };
  const auto good = decode(one(forged(reply(10), 0, 0)));
  ASSERT_TRUE(good.ok());
  const auto& views = std::get<CommitReply>(good->header.body).current_views;
  EXPECT_EQ(views, (std::vector<CurrentView>{{1, 9}, {2, 10}}));
  EXPECT_EQ(error_of(one(forged(reply(0), 0, 0))), DecodeErrc::badField);
}

TEST(CodecMalformed, PayloadLengthMismatch) {
  const auto payload = random_bytes(64, 5);
  auto frames = encode_copy(Header{1, "j", PushGradients{1, 1, 0, DType::fp32, 16, {}}}, payload);
  frames[1] = zmq::message_t(payload.data(), 60);
  EXPECT_EQ(error_of(frames), DecodeErrc::lengthMismatch);

  // Declared length agrees with the frame, but not with element count * dtype size.
  auto fill = [](uint64_t count) {
    return [count](wire::Header::Builder h) {
      auto p = h.getKind().initPushGradients();
      p.setDtype(wire::DType::BF16);
      p.setElementCount(count);
    };
  };
  const uint32_t crc = checksum::crc32c(payload.data(), payload.size());
  EXPECT_EQ(error_of(two(forged(fill(31), 64, crc), payload)), DecodeErrc::lengthMismatch);
  // A count whose byte size wraps around 2^64 to 64.
  EXPECT_EQ(error_of(two(forged(fill((1ull << 63) + 32), 64, crc), payload)),
            DecodeErrc::lengthMismatch);
  EXPECT_TRUE(decode(two(forged(fill(32), 64, crc), payload)).ok());

  // A kind without payload that declares one.
  auto stats = one(forged([](wire::Header::Builder h) { h.getKind().initStats(); }, 8));
  EXPECT_EQ(error_of(stats), DecodeErrc::lengthMismatch);
}

TEST(CodecMalformed, ChecksumMismatch) {
  auto payload = random_bytes(4096, 6);
  auto frames = encode_copy(Header{1, "j", FetchReply{1, 1, DType::fp16, 2048, {}}}, payload);
  static_cast<std::byte*>(frames[1].data())[1234] ^= std::byte{0x10};
  EXPECT_EQ(error_of(frames), DecodeErrc::checksumMismatch);

  Limits no_check;
  no_check.verify_checksum = false;
  EXPECT_TRUE(decode(frames, no_check).ok());
}

TEST(CodecMalformed, DeferredPushChecksumIsLeftPendingForPushesOnly) {
  auto payload = random_bytes(4096, 8);
  auto push = encode_copy(Header{1, "j", PushGradients{1, 1, 0, DType::fp32, 1024, {}}}, payload);
  auto set = encode_copy(Header{2, "j", SetParameters{1, 1, DType::fp32, 1024}}, payload);
  const uint32_t declared = checksum::crc32c(payload.data(), payload.size());
  static_cast<std::byte*>(push[1].data())[77] ^= std::byte{0x01};
  static_cast<std::byte*>(set[1].data())[77] ^= std::byte{0x01};

  Limits deferred;
  deferred.defer_push_checksum = true;
  auto msg = decode(push, deferred);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  EXPECT_TRUE(msg->payload_crc_pending);
  EXPECT_EQ(msg->payload_crc32c, declared);                          // the receiver's to compare
  EXPECT_EQ(error_of(set, deferred), DecodeErrc::checksumMismatch);  // other kinds: checked here
  EXPECT_EQ(error_of(push), DecodeErrc::checksumMismatch);           // not deferred by default

  // Checksums off: nothing is pending either.
  deferred.verify_checksum = false;
  msg = decode(push, deferred);
  ASSERT_TRUE(msg.ok());
  EXPECT_FALSE(msg->payload_crc_pending);
}

TEST(CodecMalformed, OversizedPayloadAndHeader) {
  const auto payload = random_bytes(4096, 7);
  auto frames = encode_copy(Header{1, "j", SetParameters{1, 1, DType::fp32, 1024}}, payload);
  Limits small;
  small.max_payload_bytes = 1024;
  EXPECT_EQ(error_of(frames, small), DecodeErrc::tooLarge);

  // Declared length far above the limit, even with a matching (short) frame.
  auto fill = [](wire::Header::Builder h) {
    auto p = h.getKind().initSetParameters();
    p.setDtype(wire::DType::FP32);
    p.setElementCount(1ull << 40);
  };
  EXPECT_EQ(error_of(two(forged(fill, 4ull << 40), payload)), DecodeErrc::tooLarge);

  Limits tiny_header;
  tiny_header.max_header_bytes = 16;
  EXPECT_EQ(error_of(encode(every_kind()[0]), tiny_header), DecodeErrc::tooLarge);
}

TEST(CodecMalformed, BadDtype) {
  const auto payload = random_bytes(64, 8);
  const uint32_t crc = checksum::crc32c(payload.data(), payload.size());
  for (uint16_t raw : {uint16_t{0}, uint16_t{4}, uint16_t{999}}) {
    SCOPED_TRACE(raw);
    auto fill = [raw](wire::Header::Builder h) {
      auto p = h.getKind().initPushGradients();
      p.setDtype(static_cast<wire::DType>(raw));
      p.setElementCount(16);
    };
    EXPECT_EQ(error_of(two(forged(fill, 64, crc), payload)), DecodeErrc::badDtype);
  }
  auto reg = [](wire::Header::Builder h) {
    auto parts = h.getKind().initRegister().initPartitions(1);
    parts[0].setMasterDtype(wire::DType::FP32);  // served dtype left unset
  };
  EXPECT_EQ(error_of(one(forged(reg))), DecodeErrc::badDtype);
}

TEST(CodecMalformed, SchemaMismatch) {
  auto frames =
      one(forged([](wire::Header::Builder h) { h.setSchemaVersion(kSchemaVersion + 1); }));
  EXPECT_EQ(error_of(frames), DecodeErrc::schemaMismatch);
  auto unset = one(forged([](wire::Header::Builder h) {
    h.setSchemaVersion(0);
    h.getKind().initPing();
  }));
  EXPECT_EQ(error_of(unset), DecodeErrc::schemaMismatch);
}

TEST(CodecMalformed, UnknownKind) {
  // A union member from a newer schema: set the discriminant past the last known ordinal.
  auto node = capnp::Schema::from<wire::Header::Kind>().getProto().getStruct();
  // In 16-bit units of the data section; the union lives in the `kind` group node.
  const uint32_t offset = node.getDiscriminantOffset();
  ASSERT_GT(node.getDiscriminantCount(), 0u);
  capnp::MallocMessageBuilder b;
  auto h = b.initRoot<wire::Header>();
  h.setSchemaVersion(kSchemaVersion);
  h.getKind().initPing();
  auto data = b.getRoot<capnp::AnyStruct>().getDataSection();
  ASSERT_GE(data.size(), offset * 2 + 2);
  const uint16_t unknown = 200;
  std::memcpy(data.begin() + offset * 2, &unknown, 2);
  auto flat = capnp::messageToFlatArray(b);
  auto frames = one(zmq::message_t(flat.asBytes().begin(), flat.asBytes().size()));
  EXPECT_EQ(error_of(frames), DecodeErrc::unknownKind);
  EXPECT_EQ(reply_code(DecodeErrc::unknownKind), ErrorCode::notImplemented);
}

TEST(CodecMalformed, FieldsOutOfRange) {
  auto bad_opt = [](wire::Header::Builder h) {
    auto parts = h.getKind().initRegister().initPartitions(1);
    parts[0].setMasterDtype(wire::DType::FP32);
    parts[0].setServedDtype(wire::DType::BF16);
    parts[0].initOptimizer().setKind(static_cast<wire::OptimizerKind>(7));
  };
  EXPECT_EQ(error_of(one(forged(bad_opt))), DecodeErrc::badField);

  Limits limits;
  limits.max_text_bytes = 8;
  EXPECT_EQ(error_of(encode(Header{1, "a-very-long-job-id", Stats{}}), limits),
            DecodeErrc::badField);
  StatsReply long_pinning;
  long_pinning.pinning = "cudaHostAlloc";  // 13 bytes > 8
  EXPECT_EQ(error_of(encode(Header{1, "j", long_pinning}), limits), DecodeErrc::badField);
  limits = {};
  limits.max_list_items = 1;
  EXPECT_EQ(error_of(encode(every_kind()[0]), limits), DecodeErrc::badField);  // 2 specs
  limits = {};
  limits.max_record_bytes = 4;
  EXPECT_EQ(error_of(encode(Header{1, "j", CommitStep{1, 1, 1, 0, "12345"}}), limits),
            DecodeErrc::tooLarge);
  EXPECT_EQ(error_of(encode(Header{1, "j", SkipStep{1, "12345"}}), limits), DecodeErrc::tooLarge);
}

TEST(CodecMalformed, ArenaSlices) {
  // A push whose 16 fp32 values are said to lie in an arena.
  auto push = [](uint64_t id, uint64_t offset, uint64_t length, uint64_t count = 16,
                 uint32_t crc = 0, bool omitted = false) {
    return [=](wire::Header::Builder h) {
      auto p = h.getKind().initPushGradients();
      p.setPartitionId(1);
      p.setStep(1);
      p.setDtype(wire::DType::FP32);
      p.setElementCount(count);
      auto a = p.initArena();
      a.setArenaId(id);
      a.setOffset(offset);
      a.setLength(length);
      a.setCrc32c(crc);
      a.setCrcOmitted(omitted);
    };
  };
  ASSERT_TRUE(decode(one(forged(push(1, 0, 64)))).ok());
  // A crc said to be omitted must be 0: a slice cannot both declare and omit it.
  ASSERT_TRUE(decode(one(forged(push(1, 0, 64, 16, 0, true)))).ok());
  EXPECT_EQ(error_of(one(forged(push(1, 0, 64, 16, 7, true)))), DecodeErrc::badField);
  EXPECT_EQ(error_of(one(forged(push(0, 0, 64)))), DecodeErrc::badField);  // id 0
  // offset + length wraps around 2^64: refused before any receiver adds them.
  EXPECT_EQ(error_of(one(forged(push(1, UINT64_MAX - 10, 64)))), DecodeErrc::badField);
  EXPECT_EQ(error_of(one(forged(push(1, 0, 60)))), DecodeErrc::lengthMismatch);
  // count * 4 wraps to 64: the division check does not fall for it.
  EXPECT_EQ(error_of(one(forged(push(1, 0, 64, (1ull << 62) + 16)))), DecodeErrc::lengthMismatch);
  Limits small;
  small.max_payload_bytes = 32;
  EXPECT_EQ(error_of(one(forged(push(1, 0, 64))), small), DecodeErrc::tooLarge);
  // Bytes in the arena and a payload frame too, or a header that declares a frame.
  const auto payload = random_bytes(64, 9);
  EXPECT_EQ(error_of(two(forged(push(1, 0, 64)), payload)), DecodeErrc::wrongFrameCount);
  EXPECT_EQ(error_of(one(forged(push(1, 0, 64), 64, checksum::crc32c(payload.data(), 64)))),
            DecodeErrc::lengthMismatch);

  auto fetch = [](uint64_t id, uint64_t offset, uint64_t length) {
    return [=](wire::Header::Builder h) {
      auto f = h.getKind().initFetchParameters();
      f.setDtype(wire::DType::BF16);
      auto a = f.initArena();
      a.setArenaId(id);
      a.setOffset(offset);
      a.setLength(length);
    };
  };
  ASSERT_TRUE(decode(one(forged(fetch(2, 4096, 1 << 20)))).ok());
  EXPECT_EQ(error_of(one(forged(fetch(0, 0, 64)))), DecodeErrc::badField);
  EXPECT_EQ(error_of(one(forged(fetch(2, UINT64_MAX, 1)))), DecodeErrc::badField);

  auto reply = [](uint64_t length) {
    return [=](wire::Header::Builder h) {
      auto f = h.getKind().initFetchReply();
      f.setDtype(wire::DType::BF16);
      f.setElementCount(300);
      auto a = f.initArena();
      a.setArenaId(2);
      a.setLength(length);
    };
  };
  ASSERT_TRUE(decode(one(forged(reply(600)))).ok());
  EXPECT_EQ(error_of(one(forged(reply(602)))), DecodeErrc::lengthMismatch);
}

TEST(CodecMalformed, ZeroSizedListElementsDoNotAmplify) {
  // Found by fuzz_decode: capnp may encode a struct list as a list of zero-word elements,
  // so a tiny header can claim ~a million items. Each would become 16 bytes in memory.
  capnp::MallocMessageBuilder b;
  auto h = b.initRoot<wire::Header>();
  h.setSchemaVersion(kSchemaVersion);
  auto reply = h.getKind().initRegisterReply();
  auto voids = b.getOrphanage().newOrphan<capnp::List<capnp::Void>>(100000);
  capnp::toAny(reply).getPointerSection()[1].adopt(kj::mv(voids));  // partitions @1
  auto flat = capnp::messageToFlatArray(b);
  ASSERT_LT(flat.size(), 16u);
  auto frames = one(zmq::message_t(flat.asBytes().begin(), flat.asBytes().size()));
  EXPECT_EQ(error_of(frames), DecodeErrc::badField);
}

TEST(CodecMalformed, TraversalLimit) {
  Register reg;
  reg.partitions.resize(1000);
  auto frames = encode(Header{1, "j", reg});
  ASSERT_TRUE(decode(frames).ok());
  Limits limits;
  limits.traversal_limit_words = 64;
  EXPECT_EQ(error_of(frames, limits), DecodeErrc::badHeader);
}

TEST(CodecMalformed, UnknownErrorCodeStaysReadable) {
  auto frames = one(forged([](wire::Header::Builder h) {
    auto e = h.getKind().initErrorReply();
    e.setCode(static_cast<wire::ErrorCode>(77));
    e.setMessage("from the future");
  }));
  auto msg = decode(frames);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  const auto& e = std::get<ErrorReply>(msg->header.body);
  EXPECT_EQ(e.code, ErrorCode::internal);
  EXPECT_NE(e.message.find("77"), std::string::npos);
  EXPECT_NE(e.message.find("from the future"), std::string::npos);
}

// A peer built before Checkpoint.name, MapArena.ticket and friends existed sends headers
// without them; they decode, the new fields empty (the service then refuses the path).
TEST(Codec, HeadersOfOlderPeersStillDecode) {
  auto checkpoint = one(forged([](wire::Header::Builder h) {
    auto c = h.getKind().initCheckpoint();
    c.setTag("t");
    c.setPath("/abs/path");
  }));
  auto msg = decode(checkpoint);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  EXPECT_EQ(std::get<Checkpoint>(msg->header.body), (Checkpoint{"t", "/abs/path", ""}));
  auto map = one(forged([](wire::Header::Builder h) {
    auto m = h.getKind().initMapArena();
    m.setPath("/proc/1/fd/3");
    m.setSize(4096);
  }));
  msg = decode(map);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  EXPECT_EQ(std::get<MapArena>(msg->header.body), (MapArena{"/proc/1/fd/3", 4096, ""}));
}

TEST(Codec, UnalignedHeaderFrame) {
  // zmq gives no alignment guarantee for frame data; decode must copy before reading.
  auto good = frame_bytes(encode(every_kind()[0])[0]);
  std::vector<std::byte> storage(good.size() + 1);
  std::memcpy(storage.data() + 1, good.data(), good.size());
  std::vector<zmq::message_t> frames;
  frames.emplace_back(
      storage.data() + 1, good.size(), [](void*, void*) {}, nullptr);
  ASSERT_NE(reinterpret_cast<uintptr_t>(frames[0].data()) % 8, 0u);
  auto msg = decode(frames);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  EXPECT_EQ(msg->header, every_kind()[0]);
}

TEST(Codec, ErrorReplyForUndecodableRequest) {
  auto reply = error_reply(42, "job", DecodeError{DecodeErrc::checksumMismatch, "crc 1 != 2"});
  auto msg = decode(encode(reply));
  ASSERT_TRUE(msg.ok());
  EXPECT_EQ(msg->header.request_id, 42u);
  const auto& e = std::get<ErrorReply>(msg->header.body);
  EXPECT_EQ(e.code, ErrorCode::checksumMismatch);
  EXPECT_EQ(e.message, "checksumMismatch: crc 1 != 2");
  EXPECT_EQ(reply_code(DecodeErrc::tooLarge), ErrorCode::tooLarge);
  EXPECT_EQ(reply_code(DecodeErrc::badHeader), ErrorCode::malformed);
  EXPECT_EQ(reply_code(DecodeErrc::schemaMismatch), ErrorCode::schemaMismatch);
}

// ---- envelopes and sockets ------------------------------------------------------------

TEST(Envelope, SplitAndRebuild) {
  std::vector<zmq::message_t> frames;
  frames.emplace_back("id-1", 4);
  frames.emplace_back("id-2", 4);
  frames.emplace_back();
  for (auto& f : encode(Header{5, "j", Ping{1}})) frames.push_back(std::move(f));
  auto env = split_envelope(frames);
  ASSERT_TRUE(env.ok());
  ASSERT_EQ(env->routing.size(), 2u);
  EXPECT_EQ(env->routing[1].to_string_view(), "id-2");
  ASSERT_EQ(env->body.size(), 1u);
  ASSERT_TRUE(decode(env->body).ok());

  auto reply = with_envelope(env->routing, encode(Header{5, "j", Pong{1}}));
  ASSERT_EQ(reply.size(), 4u);
  EXPECT_EQ(reply[0].to_string_view(), "id-1");
  EXPECT_EQ(reply[2].size(), 0u);
  EXPECT_EQ(frames[0].to_string_view(), "id-1");  // source untouched

  auto no_delim = encode(Header{5, "j", Ping{1}});
  auto bad = split_envelope(no_delim);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, DecodeErrc::wrongFrameCount);
}

TEST(Loopback, RouterDealerPushOverTcp) {
  zmq::context_t ctx(1);
  zmq::socket_t router(ctx, zmq::socket_type::router);
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  for (auto* s : {&router, &dealer}) {
    s->set(zmq::sockopt::rcvtimeo, 10000);  // a lost message fails the test, never hangs it
    s->set(zmq::sockopt::sndtimeo, 10000);
    s->set(zmq::sockopt::linger, 0);
  }
  router.bind("tcp://127.0.0.1:*");
  dealer.connect(router.get(zmq::sockopt::last_endpoint));

  constexpr size_t kBytes = 4u << 20;
  // The owner's deleter tells when the last holder let go.
  auto released = std::make_shared<std::promise<void>>();
  auto released_f = released->get_future();
  std::shared_ptr<std::vector<std::byte>> grads(
      new std::vector<std::byte>(random_bytes(kBytes, 10)), [released](auto* p) {
        delete p;
        released->set_value();
      });
  const Header push{77, "gpt2-ci", PushGradients{3, 12, 1, DType::fp32, kBytes / 4, {}}};
  {
    auto out = with_envelope({}, encode(push, std::span<const std::byte>(*grads), grads));
    ASSERT_TRUE(zmq::send_multipart(dealer, out));
  }
  const std::vector<std::byte> expected = *grads;
  grads.reset();  // only the in-flight frame may keep the buffer now

  std::vector<zmq::message_t> in;
  ASSERT_TRUE(zmq::recv_multipart(router, std::back_inserter(in)));
  ASSERT_EQ(in.size(), 4u);  // identity, delimiter, header, payload
  auto env = split_envelope(in);
  ASSERT_TRUE(env.ok());
  auto msg = decode(env->body);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  EXPECT_EQ(msg->header, push);
  ASSERT_EQ(msg->payload.size(), kBytes);
  EXPECT_EQ(std::memcmp(msg->payload.data(), expected.data(), kBytes), 0);
  // ZeroMQ closes the sent frame on its I/O thread after the last byte left; the bound only
  // turns a frame that never lets go into a failure instead of a hang.
  EXPECT_EQ(released_f.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "sent payload frame still holds its owner";

  auto reply =
      with_envelope(env->routing, encode(Header{77, "gpt2-ci", PushReply{3, 12, 1, 42.0, false}}));
  ASSERT_TRUE(zmq::send_multipart(router, reply));

  std::vector<zmq::message_t> back;
  ASSERT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(back)));
  auto benv = split_envelope(back);
  ASSERT_TRUE(benv.ok());
  EXPECT_TRUE(benv->routing.empty());
  auto ack = decode(benv->body);
  ASSERT_TRUE(ack.ok()) << ack.error().message;
  EXPECT_EQ(ack->header.request_id, 77u);
  EXPECT_EQ(std::get<PushReply>(ack->header.body).sum_squares, 42.0);
}

// A service older than StatsReply's NVMe fields sends neither: the reply still decodes, and
// says it cannot tell whether there is an NVMe tier.
TEST(Codec, StatsReplyOfAnOlderServiceReadsAsUnknownTier) {
  auto frames = one(forged([](wire::Header::Builder h) {
    auto r = h.initKind().initStatsReply();
    r.setBytesInRam(4096);
    r.setPartitions(1);
    r.setPinning("none");
  }));
  auto decoded = decode(frames);
  ASSERT_TRUE(decoded.ok()) << decoded.error().message;
  const auto& reply = std::get<StatsReply>(decoded->header.body);
  EXPECT_EQ(reply.bytes_in_ram, 4096u);
  EXPECT_EQ(reply.nvme_tier, NvmeTier::kUnknown);
  EXPECT_EQ(reply.nvme_dir, "");
  auto bad = one(forged([](wire::Header::Builder h) {
    h.initKind().initStatsReply().setNvmeTier(static_cast<wire::NvmeTier>(7));
  }));
  EXPECT_EQ(error_of(bad), DecodeErrc::badField);
}

}  // namespace
}  // namespace dsactor::messages
