// The same-host request channel (messages/request_channel.h) that goes with an arena: its
// datagrams keep their bounds, tell truncation and a closed peer; the service takes only a
// connected SOCK_SEQPACKET end, reads arena pushes of the arena's job there and answers them
// there, refuses anything else on it (garbage, other kinds, other jobs, oversize datagrams,
// slices outside the arena) and keeps serving, and closes its end when the arena goes.
// Against real `dsactor start --role offload` processes.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "actors/offload_link/offload_client.h"
#include "actors/runtime/request_channels.h"
#include "messages/arena_handoff.h"
#include "messages/request_channel.h"
#include "messages/shm_arena.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using actors::OffloadClient;
using msg::Datagram;
using msg::DType;
using msg::ErrorCode;
using namespace std::chrono_literals;

std::span<const std::byte> frame_bytes(const zmq::message_t& f) {
  return {static_cast<const std::byte*>(f.data()), f.size()};
}

// The next datagram on `fd` within 10 s, decoded.
msg::Header answer_on(int fd) {
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 10000), 1) << "no answer on the channel";
  std::vector<std::byte> d;
  EXPECT_EQ(msg::receive_datagram(fd, d, msg::kMaxChannelRequestBytes), Datagram::message);
  std::vector<zmq::message_t> frames;
  frames.emplace_back(d.data(), d.size());
  auto decoded = msg::decode(frames);
  EXPECT_TRUE(static_cast<bool>(decoded)) << "the answer does not decode";
  return decoded ? decoded->header : msg::Header{};
}

void send_header(int fd, const msg::Header& h) {
  const auto frames = msg::encode(h);
  ASSERT_EQ(frames.size(), 1u);
  ASSERT_TRUE(msg::send_datagram(fd, frame_bytes(frames[0]), true));
}

void expect_error(const msg::Header& h, ErrorCode code, const std::string& words) {
  const auto* e = std::get_if<msg::ErrorReply>(&h.body);
  ASSERT_NE(e, nullptr) << "expected an ErrorReply, got " << msg::kind_name(h.body);
  EXPECT_EQ(e->code, code) << e->message;
  EXPECT_NE(e->message.find(words), std::string::npos) << e->message;
}

TEST(RequestChannel, DatagramsKeepTheirBoundsAndTellTruncationAndClose) {
  auto [mine, theirs] = msg::request_channel_pair();
  std::vector<std::byte> got;
  EXPECT_EQ(msg::receive_datagram(theirs.get(), got, 16), Datagram::none);
  const std::vector<std::byte> a(10, std::byte{1}), b(16, std::byte{2}), c(17, std::byte{3});
  for (const auto* d : {&a, &b, &c}) ASSERT_TRUE(msg::send_datagram(mine.get(), *d, false));
  // Each datagram whole and apart, never two in one read, never one in pieces.
  ASSERT_EQ(msg::receive_datagram(theirs.get(), got, 16), Datagram::message);
  EXPECT_EQ(got, a);
  ASSERT_EQ(msg::receive_datagram(theirs.get(), got, 16), Datagram::message);
  EXPECT_EQ(got, b);
  EXPECT_EQ(msg::receive_datagram(theirs.get(), got, 16), Datagram::truncated);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(msg::receive_datagram(theirs.get(), got, 16), Datagram::none)
      << "a truncated datagram is gone, not read on in pieces";
  // A datagram with an fd attached: read, and the fd not installed here.
  const int before = ::fcntl(0, F_DUPFD_CLOEXEC, 0);
  ::close(before);
  {
    iovec iov{const_cast<std::byte*>(a.data()), a.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    cmsghdr* h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    const int fd = mine.get();
    std::memcpy(CMSG_DATA(h), &fd, sizeof fd);
    ASSERT_EQ(::sendmsg(mine.get(), &m, 0), static_cast<ssize_t>(a.size()));
  }
  ASSERT_EQ(msg::receive_datagram(theirs.get(), got, 16), Datagram::message);
  EXPECT_EQ(got, a);
  const int after = ::fcntl(0, F_DUPFD_CLOEXEC, 0);
  ::close(after);
  EXPECT_EQ(after, before) << "the attached fd was installed in the reader";
  mine = {};
  EXPECT_EQ(msg::receive_datagram(theirs.get(), got, 16), Datagram::closed);
  EXPECT_FALSE(msg::send_datagram(theirs.get(), a, false));
}

TEST(RequestChannel, OnlyAConnectedSeqpacketSocketIsAChannel) {
  std::string why;
  auto [a, b] = msg::request_channel_pair();
  EXPECT_TRUE(msg::is_request_channel(a.get(), why)) << why;
  int stream[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stream), 0);
  EXPECT_FALSE(msg::is_request_channel(stream[0], why));
  EXPECT_NE(why.find("SOCK_SEQPACKET"), std::string::npos) << why;
  ::close(stream[0]);
  ::close(stream[1]);
  const msg::UniqueFd unconnected(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  EXPECT_FALSE(msg::is_request_channel(unconnected.get(), why));
  EXPECT_NE(why.find("not connected"), std::string::npos) << why;
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  EXPECT_FALSE(msg::is_request_channel(pipe_fds[0], why));
  EXPECT_NE(why.find("not a socket"), std::string::npos) << why;
  // The gateway's list checks what it is given the same way.
  actors::RequestChannels channels;
  EXPECT_THROW(channels.attach(msg::UniqueFd(pipe_fds[0]), "key", "job"), std::invalid_argument);
  ::close(pipe_fds[1]);
  const uint64_t id = channels.attach(std::move(b), "key", "job");
  EXPECT_NE(id, 0u);
  EXPECT_EQ(channels.size(), 1u);
  channels.detach(id);
  channels.detach(id);  // twice: the gateway and the arena table may both
  EXPECT_EQ(channels.size(), 0u);
}

using ServiceRequestChannel = SharedServiceTest;

// An arena mapped by hand, as OffloadClient::try_map_arena does, with a channel whose
// trainer end the test keeps.
struct HandMappedArena {
  std::unique_ptr<msg::SharedArena> arena = std::make_unique<msg::SharedArena>(65536);
  msg::UniqueFd channel;  // the trainer's end
  uint64_t arena_id = 0;
};

HandMappedArena map_with_channel(OffloadClient& c) {
  HandMappedArena out;
  const msg::Header ask = c.call(msg::MapArena{"", out.arena->size(), ""});
  const auto* t = std::get_if<msg::MapArenaReply>(&ask.body);
  EXPECT_NE(t, nullptr) << msg::kind_name(ask.body);
  if (!t) return out;
  auto [mine, theirs] = msg::request_channel_pair();
  msg::hand_over_fd(t->socket, t->ticket, out.arena->fd(), 5s, theirs.get());
  const msg::Header mapped = c.call(msg::MapArena{"", out.arena->size(), t->ticket});
  const auto* ok = std::get_if<msg::MapArenaReply>(&mapped.body);
  EXPECT_NE(ok, nullptr) << msg::kind_name(mapped.body);
  if (!ok) return out;
  EXPECT_TRUE(ok->channel) << "the service took the channel";
  out.arena_id = ok->arena_id;
  out.channel = std::move(mine);
  return out;
}

TEST_F(ServiceRequestChannel, HostileDatagramsAreRefusedOnTheChannelAndServiceKeepsServing) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "channel-hostile");
  OffloadClient other(svc_->endpoint(), svc_->client_security(), 10s, "channel-other");
  c.register_partitions(0, 1, {spec(1, 1024)});
  other.register_partitions(0, 1, {spec(1, 1024)});
  const auto values = random_floats(1024, 7);
  c.set_parameters(1, 0, DType::fp32, bytes_of(values));
  other.set_parameters(1, 0, DType::fp32, bytes_of(values));
  HandMappedArena m = map_with_channel(c);
  ASSERT_TRUE(m.channel);
  const int ch = m.channel.get();
  const auto grads = random_floats(1024, 8);
  std::memcpy(m.arena->data(), grads.data(), 4096);
  auto push = [&](uint64_t id, std::string job, std::optional<msg::ArenaSlice> slice) {
    msg::PushGradients p{1, 1, 0, DType::fp32, 1024, slice};
    return msg::Header{id, std::move(job), p};
  };
  const msg::ArenaSlice good{m.arena_id, 0, 4096, 0, true};
  // Bytes that are no header.
  const std::vector<std::byte> garbage(64, std::byte{0xab});
  ASSERT_TRUE(msg::send_datagram(ch, garbage, true));
  expect_error(answer_on(ch), ErrorCode::malformed, "");
  // A request of another kind, and a push without an arena slice.
  send_header(ch, msg::Header{11, "channel-hostile", msg::CommitStep{1, 0.5, 1.0, 1e-3}});
  expect_error(answer_on(ch), ErrorCode::malformed, "arena pushes of job 'channel-hostile' only");
  // A fetch into this arena: a one-frame request, but not a push.
  send_header(ch,
              msg::Header{12, "channel-hostile", msg::FetchParameters{1, 0, DType::fp32, good, 0}});
  expect_error(answer_on(ch), ErrorCode::malformed, "arena pushes of job 'channel-hostile' only");
  // A push whose payload would be a frame: its header alone does not decode.
  auto payload = std::make_shared<std::vector<float>>(random_floats(1024, 3));
  const auto framed_push =
      msg::encode(push(16, "channel-hostile", std::nullopt), bytes_of(*payload), payload);
  ASSERT_TRUE(msg::send_datagram(ch, frame_bytes(framed_push[0]), true));
  expect_error(answer_on(ch), ErrorCode::malformed, "");
  // A push of another job (the same key's), with a slice of this arena.
  send_header(ch, push(13, "channel-other", good));
  expect_error(answer_on(ch), ErrorCode::malformed, "of job 'channel-other'");
  // A datagram longer than any header it may carry.
  const std::vector<std::byte> huge(msg::kMaxChannelRequestBytes + 1, std::byte{0});
  ASSERT_TRUE(msg::send_datagram(ch, huge, true));
  expect_error(answer_on(ch), ErrorCode::malformed, "at most");
  // A slice outside the arena is refused by the service's own check, as over ZeroMQ.
  send_header(
      ch, push(14, "channel-hostile", msg::ArenaSlice{m.arena_id, m.arena->size(), 4096, 0, true}));
  const msg::Header outside = answer_on(ch);
  EXPECT_EQ(outside.request_id, 14u);
  expect_error(outside, ErrorCode::malformed, "outside");
  // The good push is answered there, and the step it makes is the one a frames push makes.
  send_header(ch, push(15, "channel-hostile", good));
  const msg::Header answered = answer_on(ch);
  EXPECT_EQ(answered.request_id, 15u);
  const auto* reply = std::get_if<msg::PushReply>(&answered.body);
  ASSERT_NE(reply, nullptr) << msg::kind_name(answered.body);
  const msg::PushReply framed = other.push_gradients(1, 1, 0, DType::fp32, bytes_of(grads));
  EXPECT_EQ(reply->sum_squares, framed.sum_squares);
  const msg::CommitStep commit{1, 0.5, 1.0, 1e-3};
  c.commit(commit);
  other.commit(commit);
  auto a = c.fetch(1, 1, DType::fp32);
  auto b = other.fetch(1, 1, DType::fp32);
  ASSERT_EQ(a.bytes().size(), b.bytes().size());
  EXPECT_EQ(std::memcmp(a.bytes().data(), b.bytes().data(), a.bytes().size()), 0);
  // The arena unmapped: the service closes its end of the channel.
  const msg::Header unmapped = c.call(msg::UnmapArena{m.arena_id});
  ASSERT_TRUE(std::holds_alternative<msg::UnmapArenaReply>(unmapped.body))
      << msg::kind_name(unmapped.body);
  pollfd p{ch, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1);
  std::vector<std::byte> d;
  EXPECT_EQ(msg::receive_datagram(ch, d, 64), Datagram::closed);
}

// A key that maps many arenas, each with a channel, gets at most kMaxPerClient of them
// attached (each an fd the gateway polls); past that its arenas map without one, and
// unmapping one makes room again.
TEST_F(ServiceRequestChannel, AClientKeyHoldsABoundedNumberOfChannels) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "channel-many");
  std::vector<HandMappedArena> mapped;
  for (size_t i = 0; i < actors::RequestChannels::kMaxPerClient; ++i) {
    mapped.push_back(map_with_channel(c));
    ASSERT_TRUE(mapped.back().channel) << "arena " << i;
  }
  const auto map_one = [&] {
    auto arena = std::make_unique<msg::SharedArena>(4096);
    const msg::Header ask = c.call(msg::MapArena{"", arena->size(), ""});
    const auto* t = std::get_if<msg::MapArenaReply>(&ask.body);
    EXPECT_NE(t, nullptr);
    auto [mine, theirs] = msg::request_channel_pair();
    msg::hand_over_fd(t->socket, t->ticket, arena->fd(), 5s, theirs.get());
    const msg::Header mapped_reply = c.call(msg::MapArena{"", arena->size(), t->ticket});
    const auto* ok = std::get_if<msg::MapArenaReply>(&mapped_reply.body);
    EXPECT_NE(ok, nullptr) << msg::kind_name(mapped_reply.body);
    return ok ? *ok : msg::MapArenaReply{};
  };
  const msg::MapArenaReply over = map_one();
  EXPECT_NE(over.arena_id, 0u) << "the arena still maps";
  EXPECT_FALSE(over.channel) << "past the bound no channel is attached";
  const msg::Header unmapped = c.call(msg::UnmapArena{mapped.front().arena_id});
  ASSERT_TRUE(std::holds_alternative<msg::UnmapArenaReply>(unmapped.body));
  const msg::MapArenaReply again = map_one();
  EXPECT_TRUE(again.channel) << "an unmapped arena's channel makes room";
  // Unmapped here, so the suite's later tests (the same key) start with room.
  for (uint64_t id : {over.arena_id, again.arena_id}) c.call(msg::UnmapArena{id});
  for (size_t i = 1; i < mapped.size(); ++i) c.call(msg::UnmapArena{mapped[i].arena_id});
}

// The service takes what reaches it on its two paths in whatever order it arrives, so the
// client keeps the order it sent: a commit sent right after a push on the channel waits for
// that push's answer (the commit then applies the push, as a frames job's commit applies
// its own), and a push sent while a checkpoint written in the background is unanswered
// takes the socket behind it (the checkpoint snapshots the committed step, never refused
// for holding the next step's gradients).
TEST_F(ServiceRequestChannel, RequestsNeverOvertakeEachOtherAcrossThePaths) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "channel-order");
  OffloadClient frames(svc_->endpoint(), svc_->client_security(), 10s, "channel-order-frames");
  c.set_request_channel(true);
  ASSERT_TRUE(c.map_arena(4096, 2));
  ASSERT_TRUE(c.has_request_channel());
  const auto values = random_floats(1024, 21);
  for (OffloadClient* x : {&c, &frames}) {
    x->register_partitions(0, 1, {spec(1, 1024)});
    x->set_parameters(1, 0, DType::fp32, bytes_of(values));
  }
  auto push_in_slot = [&](uint64_t step, const std::vector<float>& g) {
    actors::ArenaBuffer slot = c.arena_buffer(4096);
    EXPECT_TRUE(slot);
    std::memcpy(slot.bytes().data(), g.data(), 4096);
    return c.send_push_gradients(1, step, 0, DType::fp32, 1024, std::move(slot));
  };
  for (uint64_t step = 1; step <= 4; ++step) {
    const auto g = random_floats(1024, 30 + static_cast<uint32_t>(step));
    const uint64_t sent_before = c.channel_requests_sent();
    const uint64_t push = push_in_slot(step, g);
    EXPECT_EQ(c.channel_requests_sent(), sent_before + 1) << "the push took the channel";
    const msg::CommitStep commit{step, 0.5, 1.0, 1e-3};
    const uint64_t committing = c.send(commit);
    EXPECT_TRUE(c.arrived(push)) << "the commit went after the push's answer";
    EXPECT_EQ(c.receive_push_reply(push).step, step);
    const msg::Header done = c.receive(committing);
    ASSERT_TRUE(std::holds_alternative<msg::CommitReply>(done.body)) << msg::kind_name(done.body);
    frames.push_gradients(1, step, 0, DType::fp32, bytes_of(g));
    frames.commit(commit);
    auto a = c.fetch(1, step, DType::fp32);
    auto b = frames.fetch(1, step, DType::fp32);
    ASSERT_EQ(a.bytes().size(), b.bytes().size());
    EXPECT_EQ(std::memcmp(a.bytes().data(), b.bytes().data(), a.bytes().size()), 0)
        << "step " << step << " applied the channel's push";
  }
  // A checkpoint in flight on the socket: the next step's push goes behind it there.
  const uint64_t checkpoint = c.send(msg::Checkpoint{"order", {}, "channel-order-ckpt"});
  const uint64_t sent_before = c.channel_requests_sent();
  const uint64_t push = push_in_slot(5, random_floats(1024, 40));
  EXPECT_EQ(c.channel_requests_sent(), sent_before) << "the push overtook the checkpoint";
  const msg::Header saved = c.receive(checkpoint);
  EXPECT_TRUE(std::holds_alternative<msg::CheckpointReply>(saved.body))
      << msg::kind_name(saved.body) << ": "
      << (std::holds_alternative<msg::ErrorReply>(saved.body)
              ? std::get<msg::ErrorReply>(saved.body).message
              : "");
  EXPECT_EQ(c.receive_push_reply(push).step, 5u);
  // With nothing unanswered on the socket, pushes take the channel again.
  c.commit(msg::CommitStep{5, 0.5, 1.0, 1e-3});
  const uint64_t again = push_in_slot(6, random_floats(1024, 41));
  EXPECT_EQ(c.channel_requests_sent(), sent_before + 1);
  EXPECT_EQ(c.receive_push_reply(again).step, 6u);
}

// A second fd that is not a channel fails the whole hand-over, and the arena's ticket then
// maps nothing; a client that asks for no channel (the default) maps its arena and pushes
// over ZeroMQ.
TEST_F(ServiceRequestChannel, OnlyAChannelIsTakenAsOne) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "channel-kinds");
  msg::SharedArena arena(65536);
  const msg::Header ask = c.call(msg::MapArena{"", arena.size(), ""});
  const auto* t = std::get_if<msg::MapArenaReply>(&ask.body);
  ASSERT_NE(t, nullptr);
  int stream[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stream), 0);
  try {
    msg::hand_over_fd(t->socket, t->ticket, arena.fd(), 5s, stream[1]);
    ADD_FAILURE() << "a stream socket was taken as a channel";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a request channel"), std::string::npos) << e.what();
  }
  ::close(stream[0]);
  ::close(stream[1]);
  const msg::Header refused = c.call(msg::MapArena{"", arena.size(), t->ticket});
  expect_error(refused, ErrorCode::malformed, "no arena was handed over");

  OffloadClient plain(svc_->endpoint(), svc_->client_security(), 10s, "channel-off");
  ASSERT_TRUE(plain.map_arena(4096, 1));  // a channel is asked for only when set
  EXPECT_FALSE(plain.has_request_channel());
  plain.register_partitions(0, 1, {spec(1, 1024)});
  plain.set_parameters(1, 0, DType::fp32, bytes_of(random_floats(1024, 9)));
  actors::ArenaBuffer slot = plain.arena_buffer(4096);
  ASSERT_TRUE(slot);
  std::memset(slot.bytes().data(), 0, 4096);
  const uint64_t id = plain.send_push_gradients(1, 1, 0, DType::fp32, 1024, std::move(slot));
  EXPECT_EQ(plain.receive_push_reply(id).sum_squares, 0.0);
  EXPECT_EQ(plain.channel_requests_sent(), 0u);
}

}  // namespace
}  // namespace dsactor::offload::test
