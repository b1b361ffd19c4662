// The same-host shared-memory arena against real `dsactor start --role offload`
// processes: pushes and fetches through the arena give the bytes and results of frames,
// hostile arena requests (unmapped, out of bounds, wrong crc, a path instead of a handed-over
// fd, fds that are not sealed memfds, tickets of others) are refused with the field named
// while the service keeps serving, and a client that cannot map falls back to frames.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <map>

#include "actors/offload_link/offload_client.h"
#include "checksum/crc32c.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/cast.h"
#include "messages/arena_handoff.h"
#include "messages/shm_arena.h"
#include "tests/offload/fake_service.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using actors::FetchedParameters;
using actors::OffloadClient;
using msg::DType;
using msg::ErrorCode;
using namespace std::chrono_literals;

std::vector<std::byte> copy(std::span<const std::byte> b) {
  return {b.begin(), b.end()};
}

msg::PushReply push_through_arena(OffloadClient& c, uint64_t pid, uint64_t step, uint32_t micro,
                                  DType dtype, std::span<const std::byte> grads) {
  actors::ArenaBuffer slot = c.arena_buffer(grads.size());
  EXPECT_TRUE(slot) << "no free arena slot";
  std::memcpy(slot.bytes().data(), grads.data(), grads.size());
  const uint64_t id = c.send_push_gradients(pid, step, micro, dtype,
                                            grads.size() / msg::dtype_size(dtype), std::move(slot));
  return c.receive_push_reply(id);
}

// Step `step`'s gradients, the same for both: `arena`'s through its arena, `frames`' as frames.
void push_alike(OffloadClient& arena, OffloadClient& frames,
                const std::vector<msg::PartitionSpec>& specs, uint64_t step, uint64_t seed) {
  for (const auto& s : specs) {
    const auto g = random_floats(s.element_count, seed, 8.0f);
    push_through_arena(arena, s.partition_id, step, 0, DType::fp32, bytes_of(g));
    frames.push_gradients(s.partition_id, step, 0, DType::fp32, bytes_of(g));
  }
}

const msg::ErrorReply& error(const msg::Header& h) {
  static const msg::ErrorReply none{ErrorCode::internal, "(not an ErrorReply)"};
  const auto* e = std::get_if<msg::ErrorReply>(&h.body);
  EXPECT_NE(e, nullptr) << "expected an ErrorReply, got " << msg::kind_name(h.body);
  return e ? *e : none;
}

using OffloadArena = SharedServiceTest;

// Two jobs with the same partitions and gradients, one through the arena, one through
// frames: every push reply, and fp32 and bf16 fetches after each step, are bit-identical.
TEST_F(OffloadArena, PushesAndFetchesEqualFrames) {
  OffloadClient arena(svc_->endpoint(), svc_->client_security(), 10s, "arena");
  OffloadClient frames(svc_->endpoint(), svc_->client_security(), 10s, "frames");
  const std::vector<msg::PartitionSpec> specs{spec(1, 300000), spec(2, 4097)};
  arena.set_request_channel(true);
  ASSERT_TRUE(arena.map_arena(300000 * 4, 3));
  EXPECT_FALSE(frames.has_arena());
  EXPECT_TRUE(arena.has_request_channel()) << "the service took the arena's request channel";
  for (OffloadClient* c : {&arena, &frames}) {
    c->register_partitions(0, 1, specs);
    for (const auto& s : specs)
      c->set_parameters(s.partition_id, 0, DType::fp32,
                        bytes_of(random_floats(s.element_count, 11 + s.partition_id)));
  }
  uint32_t seed = 100;
  for (uint64_t step = 1; step <= 3; ++step) {
    for (uint32_t micro = 0; micro < 2; ++micro) {
      for (const auto& s : specs) {
        // fp32 on the first micro-step, bf16 on the second: both dtypes through the arena.
        const auto g = random_floats(s.element_count, seed++, 64.0f);
        std::vector<uint16_t> half(g.size());
        kernels::cpu::floats_to_half(half.data(), g.data(), g.size(),
                                     kernels::cpu::HalfKind::kBF16);
        const DType dt = micro == 0 ? DType::fp32 : DType::bf16;
        const auto bytes = micro == 0 ? bytes_of(g) : bytes_of(half);
        const auto a = push_through_arena(arena, s.partition_id, step, micro, dt, bytes);
        const auto f = frames.push_gradients(s.partition_id, step, micro, dt, bytes);
        EXPECT_EQ(a.sum_squares, f.sum_squares);
        EXPECT_EQ(a.nonfinite, f.nonfinite);
      }
    }
    // Every arena push went over the request channel, no other request did.
    EXPECT_EQ(arena.channel_requests_sent(), step * 2 * specs.size());
    EXPECT_EQ(frames.channel_requests_sent(), 0u);
    const msg::CommitStep commit{step, 0.5, 1.0, 1e-3};
    arena.commit(commit);
    frames.commit(commit);
    for (const auto& s : specs) {
      for (DType dt : {DType::fp32, DType::bf16}) {
        auto a = arena.fetch(s.partition_id, step, dt);
        auto f = frames.fetch(s.partition_id, step, dt);
        EXPECT_TRUE(a.in_arena());
        EXPECT_FALSE(f.in_arena());
        EXPECT_EQ(a.reply.version, step);
        EXPECT_EQ(a.reply.element_count, s.element_count);
        EXPECT_EQ(copy(a.bytes()), copy(f.bytes())) << "partition " << s.partition_id;
      }
    }
  }
}

// With master views, a whole fp32 fetch maps the service's master read-only instead of
// having it copied into a slot: the bytes equal a frames fetch after every step (the view
// follows the master as Adam updates it), the view's fd is collected once per partition
// (later replies carry no ticket), another client of the job collects the same view, another
// job's partition is another view, and bf16 fetches are still copied into the slot. A
// commit answered after the update names each partition's view (CommitReply::current_views),
// and a view mapped before that commit then reads the committed step; one answered before
// the update names none.
TEST_F(OffloadArena, MasterViewsReadTheMasterWhereItLies) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "views");
  OffloadClient again(svc_->endpoint(), svc_->client_security(), 10s, "views");
  OffloadClient other(svc_->endpoint(), svc_->client_security(), 10s, "views-other");
  OffloadClient frames(svc_->endpoint(), svc_->client_security(), 10s, "views-frames");
  const std::vector<msg::PartitionSpec> specs{spec(1, 300000), spec(2, 4097)};
  for (OffloadClient* x : {&c, &again, &other}) {
    ASSERT_TRUE(x->map_arena(300000 * 4, 2));
    x->set_master_views(true);
  }
  for (OffloadClient* x : {&c, &other, &frames}) {
    x->register_partitions(0, 1, specs);
    for (const auto& s : specs)
      x->set_parameters(s.partition_id, 0, DType::fp32,
                        bytes_of(random_floats(s.element_count, 21 + s.partition_id)));
  }
  std::map<uint64_t, uint64_t> view_of;        // partition -> view id
  std::map<uint64_t, FetchedParameters> held;  // partition -> its view mapped at step 1
  for (uint64_t step = 0; step <= 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step > 0) {
      push_alike(c, frames, specs, step, 40 + step);
      msg::CommitStep commit{step, 0.5, 1.0, 1e-3};
      frames.commit(commit);
      commit.publish_before_reply = step == 2;
      const msg::CommitReply reply = c.commit(commit);
      if (step == 2) {
        std::vector<msg::CurrentView> want;
        for (const auto& s : specs) want.push_back({s.partition_id, view_of[s.partition_id]});
        auto got = reply.current_views;
        std::sort(got.begin(), got.end(),
                  [](const auto& a, const auto& b) { return a.partition_id < b.partition_id; });
        EXPECT_EQ(got, want);
        for (const auto& s : specs) {
          const auto f = frames.fetch(s.partition_id, step, DType::fp32);
          EXPECT_EQ(copy(held.at(s.partition_id).bytes()), copy(f.bytes()))
              << "the view mapped at step 1 reads step 2, partition " << s.partition_id;
        }
      } else {
        EXPECT_TRUE(reply.current_views.empty()) << "answered before the update";
      }
    }
    for (const auto& s : specs) {
      auto v = c.fetch(s.partition_id, step, DType::fp32);
      const auto f = frames.fetch(s.partition_id, step, DType::fp32);
      ASSERT_TRUE(v.in_view()) << "partition " << s.partition_id;
      EXPECT_FALSE(v.in_arena());
      ASSERT_TRUE(v.reply.master_view);
      EXPECT_EQ(v.reply.version, step);
      EXPECT_EQ(copy(v.bytes()), copy(f.bytes())) << "partition " << s.partition_id;
      // The first fetch of a partition collects its view; later ones name the view held.
      EXPECT_EQ(v.reply.master_view->ticket.empty(), step > 0);
      if (step == 0) view_of[s.partition_id] = v.reply.master_view->view_id;
      EXPECT_EQ(v.reply.master_view->view_id, view_of[s.partition_id]);
      const auto half = c.fetch(s.partition_id, step, DType::bf16);
      EXPECT_TRUE(half.in_arena());
      EXPECT_FALSE(half.in_view());
      if (step == 1) held.emplace(s.partition_id, std::move(v));
    }
  }
  for (const auto& s : specs) {
    const auto same = again.fetch(s.partition_id, 2, DType::fp32);
    ASSERT_TRUE(same.in_view());
    EXPECT_FALSE(same.reply.master_view->ticket.empty()) << "a client collects its own fd";
    EXPECT_EQ(same.reply.master_view->view_id, view_of[s.partition_id]);
    const auto theirs = other.fetch(s.partition_id, 0, DType::fp32);
    ASSERT_TRUE(theirs.in_view());
    EXPECT_NE(theirs.reply.master_view->view_id, view_of[s.partition_id]);
    expect_bits_equal(random_floats(s.element_count, 21 + s.partition_id), theirs.bytes(),
                      "the other job's partition");
  }
}

// A trainer keeps each partition's view fd across a service's restart (recovery reconnects
// the same clients): were the restarted service to name its new view like the old one, the
// trainer would read the old, stale master through the fd it held. Two fresh services, the
// same job and partition: their views' ids differ.
TEST(MasterViewIds, TwoServicesNeverNameTheirViewsAlike) {
  TempDir logs;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 2; ++i) {
    ServiceProcess svc({}, logs.path);
    OffloadClient c(svc.endpoint(), svc.client_security(), 10s, "restarted");
    ASSERT_TRUE(c.map_arena(4096 * 4, 1));
    c.set_master_views(true);
    c.register_partitions(0, 1, {spec(1, 4096)});
    c.set_parameters(1, 0, DType::fp32, bytes_of(random_floats(4096, 5)));
    const auto f = c.fetch(1, 0, DType::fp32);
    ASSERT_TRUE(f.in_view());
    ids.push_back(f.reply.master_view->view_id);
    svc.stop();
  }
  EXPECT_NE(ids[0], ids[1]);
}

// A client that reads the views (MasterViewUse::read) gets the same answers as one that
// maps them, in the slot it offered: the service wrote nothing there (it answered with its
// view), the client copied the master in. The first fetch collects the view's fd, later
// ones read through the fd held; the fd reads the committed step after each commit; a bf16
// fetch is still the service's copy.
TEST_F(OffloadArena, ReadMasterViewsCopyTheMasterIntoTheOfferedSlot) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "views-read");
  OffloadClient frames(svc_->endpoint(), svc_->client_security(), 10s, "views-read-frames");
  const std::vector<msg::PartitionSpec> specs{spec(1, 300000), spec(2, 4097)};
  ASSERT_TRUE(c.map_arena(300000 * 4, 2));
  c.set_master_views(true);
  c.set_master_view_use(actors::MasterViewUse::read);
  for (OffloadClient* x : {&c, &frames}) {
    x->register_partitions(0, 1, specs);
    for (const auto& s : specs)
      x->set_parameters(s.partition_id, 0, DType::fp32,
                        bytes_of(random_floats(s.element_count, 31 + s.partition_id)));
  }
  std::map<uint64_t, std::shared_ptr<const msg::UniqueFd>> fd_of;
  for (uint64_t step = 0; step <= 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step > 0) {
      push_alike(c, frames, specs, step, 50 + step);
      const msg::CommitStep commit{step, 0.5, 1.0, 1e-3};
      frames.commit(commit);
      c.commit(commit);
    }
    for (const auto& s : specs) {
      const auto v = c.fetch(s.partition_id, step, DType::fp32);
      const auto f = frames.fetch(s.partition_id, step, DType::fp32);
      ASSERT_TRUE(v.reply.master_view) << "answered with the master's view";
      EXPECT_FALSE(v.in_view()) << "read, not mapped";
      ASSERT_TRUE(v.in_arena());
      ASSERT_TRUE(v.view_file);
      EXPECT_EQ(v.bytes().size(), s.element_count * 4);
      EXPECT_EQ(copy(v.bytes()), copy(f.bytes())) << "partition " << s.partition_id;
      EXPECT_EQ(v.reply.master_view->ticket.empty(), step > 0);
      if (step == 0) fd_of[s.partition_id] = v.view_file;
      EXPECT_EQ(v.view_file, fd_of[s.partition_id]) << "the fd collected first is kept";
      // The fd held reads what a fetch of this step would, without asking.
      std::vector<std::byte> again(s.element_count * 4);
      actors::read_master_view(fd_of[s.partition_id]->get(), again);
      EXPECT_EQ(again, copy(f.bytes()));
      const auto half = c.fetch(s.partition_id, step, DType::bf16);
      EXPECT_TRUE(half.in_arena());
      EXPECT_FALSE(half.view_file);
    }
  }
}

// The trainer maps or reads a view only where no read can fault: a memfd sealed against
// shrinking that holds the partition; anything else (an unsealed memfd, a short one) is
// refused naming why, before anything is mapped or read. Either way it sees the bytes.
TEST(MasterViewMapping, MapsOrReadsOnlyASealedMemfdHoldingThePartition) {
  auto memfd = [](size_t bytes, bool seal) {
    msg::UniqueFd fd(::memfd_create("view-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_TRUE(fd);
    EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
    std::vector<float> x(bytes / 4);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i);
    EXPECT_EQ(::pwrite(fd.get(), x.data(), bytes, 0), static_cast<ssize_t>(bytes));
    if (seal) {
      EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    return std::make_shared<const msg::UniqueFd>(std::move(fd));
  };
  using Use = std::function<void(std::shared_ptr<const msg::UniqueFd>, size_t)>;
  const Use map = [](auto fd, size_t bytes) { actors::MasterViewMapping m(fd, bytes); };
  const Use read = [](auto fd, size_t bytes) {
    std::vector<std::byte> into(bytes);
    actors::read_master_view(fd->get(), into);
  };
  for (const auto& [name, use] : {std::pair{"map", map}, std::pair{"read", read}}) {
    SCOPED_TRACE(name);
    auto refusal = [&](std::shared_ptr<const msg::UniqueFd> fd, size_t bytes) -> std::string {
      try {
        use(std::move(fd), bytes);
        return "";
      } catch (const std::runtime_error& e) {
        return e.what();
      }
    };
    EXPECT_NE(refusal(memfd(8192, false), 4096).find("not sealed against shrinking"),
              std::string::npos);
    EXPECT_NE(refusal(memfd(4096, true), 8192).find("holds 4096 bytes, asked to map 8192"),
              std::string::npos);
  }
  const auto fd = memfd(3 * 4096, true);
  actors::MasterViewMapping m(fd, 8192);
  ASSERT_EQ(m.bytes().size(), 8192u);
  float x;
  std::memcpy(&x, m.bytes().data() + 4 * 7, sizeof(x));
  EXPECT_EQ(x, 0.25f * 7);
  std::vector<float> got(3 * 1024 - 5, -1.0f);  // fewer bytes than the file: only those
  actors::read_master_view(fd->get(), std::as_writable_bytes(std::span(got)));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 0.25f * static_cast<float>(i));
}

// Both ways are timed on this host, each over every byte of its views; the names parse back.
TEST(MasterViewUse, TimesMappingAgainstReadingAndNamesTheChoice) {
  const actors::MasterViewTiming t = actors::time_master_view_use(size_t{4} << 20, 2, 2);
  std::printf("fresh views of %zu MiB: mapped and read %.2f ms of CPU, copied and read %.2f ms\n",
              t.bytes >> 20, t.map_seconds * 1e3, t.read_seconds * 1e3);
  EXPECT_EQ(t.bytes, size_t{8} << 20);
  EXPECT_GT(t.map_seconds, 0.0);
  EXPECT_GT(t.read_seconds, 0.0);
  EXPECT_LT(t.map_seconds, 60.0);
  EXPECT_LT(t.read_seconds, 60.0);
  // Read only where clearly cheaper (the copy's memory traffic is not in its CPU time).
  EXPECT_EQ(t.cheaper(), t.read_seconds < 0.75 * t.map_seconds ? actors::MasterViewUse::read
                                                               : actors::MasterViewUse::map);
  actors::MasterViewTiming tie{size_t{1} << 20, 1.0, 0.8};
  EXPECT_EQ(tie.cheaper(), actors::MasterViewUse::map);
  actors::MasterViewTiming trap{size_t{1} << 20, 1.0, 0.5};
  EXPECT_EQ(trap.cheaper(), actors::MasterViewUse::read);
  for (auto use : {actors::MasterViewUse::map, actors::MasterViewUse::read})
    EXPECT_EQ(actors::parse_master_view_use(actors::master_view_use_name(use)), use);
  EXPECT_FALSE(actors::parse_master_view_use("mmap"));
  EXPECT_FALSE(actors::parse_master_view_use(""));
}

// A fetch larger than the slot it offered is answered with a frame, same bytes.
TEST_F(OffloadArena, FetchLargerThanTheSlotComesAsAFrame) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "small-slot");
  ASSERT_TRUE(c.map_arena(4096, 1));
  c.register_partitions(0, 1, {spec(1, 5000)});
  const auto values = random_floats(5000, 3);
  c.set_parameters(1, 0, DType::fp32, bytes_of(values));
  auto big = c.fetch(1, 0, DType::fp32);  // 20000 bytes > 4096
  EXPECT_FALSE(big.in_arena());
  expect_bits_equal(values, big.bytes(), "fp32 fetch as a frame");
}

void expect_refused(const msg::Header& h, ErrorCode code, const std::string& field,
                    const std::string& why) {
  const auto& e = error(h);
  EXPECT_EQ(e.code, code) << e.message;
  EXPECT_NE(e.message.find(field), std::string::npos) << e.message;
  EXPECT_NE(e.message.find(why), std::string::npos) << e.message;
}

// Slices out of bounds, of arenas not mapped or mapped for another job, and bytes that do
// not match their crc are refused, and the service serves the real arena on.
TEST_F(OffloadArena, HostileArenaSlicesAreRefusedAndServiceKeepsServing) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "hostile");
  OffloadClient other(svc_->endpoint(), svc_->client_security(), 10s, "other-job");
  ASSERT_TRUE(c.map_arena(65536, 2));
  const uint64_t size = c.arena_bytes();
  c.register_partitions(0, 1, {spec(1, 1024)});
  other.register_partitions(0, 1, {spec(1, 1024)});
  const auto values = random_floats(1024, 5);
  c.set_parameters(1, 0, DType::fp32, bytes_of(values));
  const uint64_t id = c.arena_id();
  auto push = [&](msg::ArenaSlice a) {
    return msg::PushGradients{1, 1, 0, DType::fp32, a.length / 4, a};
  };
  // Out of bounds: past the end, straddling it, and an offset whose sum wraps (refused
  // by the decoder before the service adds anything).
  expect_refused(c.call(push({id, size, 4096, 0})), ErrorCode::malformed, "pushGradients.arena",
                 "outside");
  expect_refused(c.call(push({id, size - 1024, 4096, 0})), ErrorCode::malformed,
                 "pushGradients.arena", "outside");
  expect_refused(c.call(push({id, UINT64_MAX - 4095, 4096, 0})), ErrorCode::malformed,
                 "pushGradients.arena.offset", "overflows");
  expect_refused(c.call(msg::FetchParameters{1, 0, DType::fp32, msg::ArenaSlice{id, 8, size, 0}}),
                 ErrorCode::malformed, "fetchParameters.arena", "outside");
  // Arenas that are not mapped, or mapped for another job.
  expect_refused(c.call(push({id + 1000, 0, 4096, 0})), ErrorCode::malformed,
                 "pushGradients.arena.arenaId", "not mapped");
  expect_refused(
      other.call(msg::FetchParameters{1, 0, DType::fp32, msg::ArenaSlice{id, 0, 4096, 0}}),
      ErrorCode::malformed, "fetchParameters.arena.arenaId", "not mapped");
  // Arena bytes that do not match their crc.
  actors::ArenaBuffer slot = c.arena_buffer(4096);
  ASSERT_TRUE(slot);
  std::memset(slot.bytes().data(), 0, 4096);
  const uint32_t crc = checksum::crc32c(slot.bytes().data(), 4096);
  expect_refused(c.call(push({id, slot.offset(), 4096, crc ^ 1})), ErrorCode::checksumMismatch,
                 "pushGradients.arena", "crc32c");
  // Unmapping someone else's arena is refused; the service still serves the real one.
  expect_refused(other.call(msg::UnmapArena{id}), ErrorCode::malformed, "unmapArena.arenaId",
                 "not mapped");
  slot = {};
  auto f = c.fetch(1, 0, DType::fp32);
  EXPECT_TRUE(f.in_arena());
  expect_bits_equal(values, f.bytes(), "fetch after the refusals");
}

// MapArena by path, fds that are not a sealed memfd of the size asked, and tickets of
// another job or spent are refused, and the service serves the real arena on.
TEST_F(OffloadArena, HostileArenaMappingsAreRefusedAndServiceKeepsServing) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "hostile");
  OffloadClient other(svc_->endpoint(), svc_->client_security(), 10s, "other-job");
  ASSERT_TRUE(c.map_arena(65536, 2));
  c.register_partitions(0, 1, {spec(1, 1024)});
  other.register_partitions(0, 1, {spec(1, 1024)});
  const auto values = random_floats(1024, 5);
  c.set_parameters(1, 0, DType::fp32, bytes_of(values));
  // MapArena by path is refused, whatever the path names (a memfd of ours included).
  const std::string self_fd = "/proc/" + std::to_string(getpid()) + "/fd/";
  const int plain = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(ftruncate(plain, 65536), 0);
  const int sealed = memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(sealed, 0);
  ASSERT_EQ(ftruncate(sealed, 4096), 0);
  ASSERT_EQ(fcntl(sealed, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  for (const std::string& path : {std::string("/etc/passwd"), self_fd + std::to_string(sealed)}) {
    SCOPED_TRACE(path);
    expect_refused(c.call(msg::MapArena{path, 4096, ""}), ErrorCode::malformed, "mapArena.path",
                   "never opened by path");
  }
  expect_refused(c.call(msg::MapArena{"", uint64_t{1} << 50, ""}), ErrorCode::tooLarge,
                 "mapArena.size", "arena limit");
  // Fds that are not a sealed memfd of the size asked are refused at the hand-over, and
  // the ticket then maps nothing.
  const TempDir dir;
  const std::string file = (dir.path / "f").string();
  { std::ofstream(file) << std::string(65536, 'x'); }
  const int regular = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(regular, 0);
  auto ticket = [&](OffloadClient& client, uint64_t bytes) {
    const msg::Header h = client.call(msg::MapArena{"", bytes, ""});
    const auto* t = std::get_if<msg::MapArenaReply>(&h.body);
    EXPECT_NE(t, nullptr) << msg::kind_name(h.body);
    return t ? *t : msg::MapArenaReply{};
  };
  for (const auto& [fd, bytes, why] : std::vector<std::tuple<int, uint64_t, std::string>>{
           // "not a sealable memfd" or, on tmpfs, "not sealed against shrinking".
           {regular, 4096, "seal"},
           {plain, 4096, "not sealed against shrinking"},
           {sealed, 8192, "asked to map"},
       }) {
    SCOPED_TRACE(why);
    const auto t = ticket(c, bytes);
    ASSERT_FALSE(t.ticket.empty());
    EXPECT_EQ(t.arena_id, 0u);
    try {
      msg::hand_over_fd(t.socket, t.ticket, fd, 5s);
      ADD_FAILURE() << "the hand-over was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    expect_refused(c.call(msg::MapArena{"", bytes, t.ticket}), ErrorCode::malformed,
                   "mapArena.ticket", "no arena was handed over");
  }
  // A ticket is its job's, and spent once used.
  const auto t = ticket(c, 4096);
  msg::hand_over_fd(t.socket, t.ticket, sealed, 5s);
  expect_refused(other.call(msg::MapArena{"", 4096, t.ticket}), ErrorCode::malformed,
                 "mapArena.ticket", "unknown");
  expect_refused(c.call(msg::MapArena{"", 4096, "00" + t.ticket.substr(2)}), ErrorCode::malformed,
                 "mapArena.ticket", "unknown");
  const msg::Header mapped = c.call(msg::MapArena{"", 4096, t.ticket});
  ASSERT_TRUE(std::holds_alternative<msg::MapArenaReply>(mapped.body)) << error(mapped).message;
  EXPECT_NE(std::get<msg::MapArenaReply>(mapped.body).arena_id, 0u);
  expect_refused(c.call(msg::MapArena{"", 4096, t.ticket}), ErrorCode::malformed, "mapArena.ticket",
                 "unknown");
  ::close(regular);
  ::close(plain);
  ::close(sealed);
  auto f = c.fetch(1, 0, DType::fp32);
  EXPECT_TRUE(f.in_arena());
  expect_bits_equal(values, f.bytes(), "fetch after the refusals");
}

// Page keeping: a slot keeps the pages of a use up to keep_bytes, a larger use gives all
// of them back at release, and trim_free_slots() gives back what free slots kept, never a
// taken slot's.
TEST_F(OffloadArena, SlotsKeepSmallUsesAndTrimGivesThemBack) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "keep");
  ASSERT_TRUE(c.map_arena(16 * 4096, 2, {.per_slot = 4 * 4096}));
  {
    actors::ArenaBuffer small = c.arena_buffer(3 * 4096);
    ASSERT_TRUE(small);
    std::memset(small.bytes().data(), 1, 3 * 4096);
  }
  {
    actors::ArenaBuffer large = c.arena_buffer(10 * 4096);  // the same, lowest, slot
    ASSERT_TRUE(large);
  }
  EXPECT_EQ(c.trim_free_slots(), 0u) << "the large use gave the slot's pages back";
  actors::ArenaBuffer held = c.arena_buffer(2 * 4096);
  ASSERT_TRUE(held);
  {
    actors::ArenaBuffer other = c.arena_buffer(4 * 4096);
    ASSERT_TRUE(other);
  }
  EXPECT_EQ(c.trim_free_slots(), 4 * 4096u) << "the free slot's kept use, not the held one";
  EXPECT_EQ(c.trim_free_slots(), 0u);
  held = {};
  EXPECT_EQ(c.trim_free_slots(), 2 * 4096u);
}

// Slot choice: a use goes to a free slot whose kept pages already cover it (the smallest
// such), else to the one that kept the most. So with everything kept, a repeated pattern
// of one large and two small uses (an embedding and layers) faults its pages in once; a
// lowest-first choice would move the large use between slots and fault it in again.
TEST_F(OffloadArena, SlotsServeRepeatedUsesFromTheirKeptPages) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "reuse");
  constexpr size_t page = 4096;
  ASSERT_TRUE(c.map_arena(16 * page, 3));  // every use's pages kept
  auto round = [&] {
    actors::ArenaBuffer small = c.arena_buffer(3 * page);
    actors::ArenaBuffer large = c.arena_buffer(12 * page);
    ASSERT_TRUE(small && large);
    EXPECT_LE(large.dirty_bytes(), 12 * page);
    std::memset(large.bytes().data(), 1, 12 * page);
    small = {};  // the layer-sized slot is free while the next small use comes
    actors::ArenaBuffer next = c.arena_buffer(2 * page);
    ASSERT_TRUE(next);
  };
  round();
  const uint64_t first = c.faulted_slot_bytes();
  EXPECT_EQ(first, 15 * page) << "the first round faults in its uses' pages";
  EXPECT_EQ(c.resident_slot_bytes(), 15 * page);
  for (int i = 0; i < 3; ++i) round();
  EXPECT_EQ(c.faulted_slot_bytes(), first) << "later rounds reuse the kept pages";
  EXPECT_EQ(c.resident_slot_bytes(), 15 * page);
  // A slot that kept pages reads back what its last use wrote; one never touched, zeros.
  actors::ArenaBuffer large = c.arena_buffer(12 * page);
  EXPECT_EQ(large.dirty_bytes(), 12 * page);
  actors::ArenaBuffer fresh = c.arena_buffer(16 * page);
  actors::ArenaBuffer last = c.arena_buffer(page);
  ASSERT_TRUE(fresh && last);
  EXPECT_EQ(std::min(fresh.dirty_bytes(), last.dirty_bytes()), 0u) << "the untouched slot";
  EXPECT_EQ(c.trim_free_slots(), 0u) << "every slot is taken";
  large = {};
  EXPECT_EQ(c.trim_free_slots(), 12 * page);
  EXPECT_EQ(c.arena_buffer(page).dirty_bytes(), 0u) << "given back: zeros again";
}

// The pool's bound: slots keep their uses' pages while the pool's kept pages stay within
// it; a use beyond it (a third layer-sized slot while two are kept: a push queued behind
// another) lends its pages for that use only, so the pool keeps no more than the bound
// however many slots were once in use at the same time, and a later round that does the
// same faults in only that use's pages again.
TEST_F(OffloadArena, PoolKeepsNoMoreThanItsBound) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "bound");
  constexpr size_t page = 4096;
  ASSERT_TRUE(c.map_arena(8 * page, 4, {.pool = 10 * page}));
  EXPECT_EQ(c.slot_keep_limit_bytes(), 10 * page);
  auto round = [&](int layers) {
    std::vector<actors::ArenaBuffer> held;
    for (int i = 0; i < layers; ++i) {
      held.push_back(c.arena_buffer(4 * page));
      ASSERT_TRUE(held.back());
      std::memset(held.back().bytes().data(), 1, 4 * page);
    }
    EXPECT_EQ(c.resident_slot_bytes(), layers * 4 * page) << "in use, whatever the bound";
  };
  round(2);
  EXPECT_EQ(c.resident_slot_bytes(), 8 * page) << "within the bound: kept";
  EXPECT_EQ(c.faulted_slot_bytes(), 8 * page);
  round(3);
  EXPECT_EQ(c.resident_slot_bytes(), 8 * page) << "the third slot's pages went back";
  EXPECT_EQ(c.faulted_slot_bytes(), 12 * page);
  round(3);
  EXPECT_EQ(c.resident_slot_bytes(), 8 * page);
  EXPECT_EQ(c.faulted_slot_bytes(), 16 * page) << "only the use beyond the bound faults again";
  round(2);
  EXPECT_EQ(c.faulted_slot_bytes(), 16 * page) << "the kept slots serve the usual rounds";
  // A given-back slot reads zeros again; the kept ones what their last use wrote.
  actors::ArenaBuffer a = c.arena_buffer(4 * page), b = c.arena_buffer(4 * page),
                      fresh = c.arena_buffer(4 * page);
  ASSERT_TRUE(a && b && fresh);
  EXPECT_EQ(a.dirty_bytes() + b.dirty_bytes(), 8 * page);
  EXPECT_EQ(fresh.dirty_bytes(), 0u);
  for (std::byte x : fresh.bytes()) ASSERT_EQ(x, std::byte{0});
}

// A second client of the same service and key shares the first one's pool (a trainer's
// fetch and push clients): a fetch that says what size it expects lands in the slot that
// kept that size, a push goes from the slot a fetch just freed, and the pool's owner
// counts each size's pages faulted in once.
TEST_F(OffloadArena, ClientsSharingAPoolReuseItsSlots) {
  OffloadClient pushes(svc_->endpoint(), svc_->client_security(), 10s, "pool");
  OffloadClient fetches(svc_->endpoint(), svc_->client_security(), 10s, "pool");
  const std::vector<float> big(3000, 1.5f), small(500, -2.0f);
  pushes.register_partitions(0, 1, {spec(1, big.size()), spec(2, small.size())});
  pushes.set_parameters(1, 0, DType::fp32, bytes_of(big));
  pushes.set_parameters(2, 0, DType::fp32, bytes_of(small));
  ASSERT_TRUE(pushes.map_arena(big.size() * 4, 2));
  fetches.share_arena(pushes);
  EXPECT_EQ(fetches.arena_id(), pushes.arena_id());
  EXPECT_EQ(fetches.arena_bytes(), 0u) << "counted once, by the client that mapped it";
  auto fetch = [&](uint64_t pid, size_t bytes) {
    return fetches.await_fetch(fetches.send_fetch(pid, 0, DType::fp32, bytes));
  };
  for (uint64_t step = 1; step <= 3; ++step) {
    {
      auto s = fetch(2, small.size() * 4);  // taken while the large one comes
      auto b = fetch(1, big.size() * 4);
      ASSERT_TRUE(s.ok() && b.ok());
      ASSERT_TRUE(s.value().in_arena() && b.value().in_arena());
      expect_bits_equal(big, b.value().bytes(), "the large fetch");
    }
    const std::vector<float> g(big.size(), 0.25f);
    const auto reply = push_through_arena(pushes, 1, step, 0, DType::fp32, bytes_of(g));
    EXPECT_EQ(reply.sum_squares, 0.0625 * static_cast<double>(g.size()));
    pushes.skip(step);  // the parameters stay at version 0
  }
  EXPECT_EQ(pushes.faulted_slot_bytes(), (big.size() + small.size()) * 4)
      << "each size faulted in once, then reused by fetches and pushes alike";
  auto pages = [](size_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  EXPECT_EQ(pushes.resident_slot_bytes(), pages(big.size() * 4) + pages(small.size() * 4))
      << "kept whole pages";
  EXPECT_THROW(pushes.share_arena(fetches), std::logic_error) << "it has an arena of its own";
}

// A client that goes sends UnmapArena for its arena on the way out, without waiting for
// the answer (a service that is gone must not hold it up): a fake service sees it arrive.
// The fake takes the arena the way a service does: a ticket, the fd on its Unix socket
// with that ticket, then the MapArena that carries the ticket.
TEST_F(OffloadArena, ACopiedInPushDeclaresTheCrcOfWhatWasCopied) {
  // copy_in keeps the crc of the bytes it copied, so the push declares it without reading
  // the slot again: the service accepts those bytes, and refuses the slot's bytes when they
  // changed after the copy (the crc is the source's, not recomputed from the slot).
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "copy-in");
  ASSERT_TRUE(c.map_arena(65536, 2));
  c.register_partitions(0, 1, {spec(1, 1024)});
  const auto g = random_floats(1024, 8);
  actors::ArenaBuffer slot = c.arena_buffer(4096);
  ASSERT_TRUE(slot);
  slot.copy_in(g.data(), 4096);
  expect_bits_equal(g, slot.bytes().first(4096), "the slot after copy_in");
  const msg::PushReply r =
      c.receive_push_reply(c.send_push_gradients(1, 1, 0, DType::fp32, 1024, std::move(slot)));
  EXPECT_EQ(r.sum_squares, kernels::cpu::grad_stats(g.data(), g.size()).sum_squares);
  actors::ArenaBuffer changed = c.arena_buffer(4096);
  ASSERT_TRUE(changed);
  changed.copy_in(g.data(), 4096);
  changed.bytes()[100] ^= std::byte{1};
  try {
    (void)c.receive_push_reply(
        c.send_push_gradients(1, 1, 1, DType::fp32, 1024, std::move(changed)));
    ADD_FAILURE() << "a slot changed after copy_in was pushed";
  } catch (const actors::OffloadError& e) {
    EXPECT_EQ(e.code(), ErrorCode::checksumMismatch) << e.what();
  }
  EXPECT_THROW(c.arena_buffer(4096).copy_in(g.data(), 65536 + 4), std::invalid_argument);
}

// Two jobs of the service with partition 1 set to `init`, both pushing in ranges of 16 KiB:
// `arena` through an arena of one slot of `slot_bytes` (its checksums on or off), `frames`
// as frames.
struct ArenaAndFrames {
  OffloadClient arena, frames;
  ArenaAndFrames(ServiceProcess& svc, const std::string& job, size_t slot_bytes, bool checksums,
                 const std::vector<float>& init)
      : arena(svc.endpoint(), svc.client_security(), 10s, job),
        frames(svc.endpoint(), svc.client_security(), 10s, job + "-frames") {
    if (!arena.map_arena(slot_bytes, 1)) throw std::runtime_error(job + ": no arena");
    arena.set_arena_checksums(checksums);
    for (OffloadClient* x : {&arena, &frames}) {
      x->set_push_range_bytes(16384);
      x->register_partitions(0, 1, {spec(1, init.size())});
      x->set_parameters(1, 0, DType::fp32, bytes_of(init));
    }
  }
};

// Commits `step` of partition 1 on both clients' jobs and expects the same parameters after.
void expect_same_commit(OffloadClient& c, OffloadClient& frames, uint64_t step) {
  const msg::CommitStep commit{step, 0.5, 1.0, 1e-3};
  c.commit(commit);
  frames.commit(commit);
  auto a = c.fetch(1, step, DType::fp32);
  auto b = frames.fetch(1, step, DType::fp32);
  std::vector<std::byte> got, want;
  for (auto piece : a.pieces()) got.insert(got.end(), piece.begin(), piece.end());
  for (auto piece : b.pieces()) want.insert(want.end(), piece.begin(), piece.end());
  EXPECT_EQ(got, want) << "step " << step;
}

// push_copied against a frames push of the same gradients, both in ranges of 16 KiB (74
// ranges, the last one short), with arena checksums off and on: the same replies and the
// same parameters after each commit, one request a range, and the slot free again once the
// push is answered.
TEST_F(OffloadArena, ACopiedPushInRangesEqualsAFramesPush) {
  constexpr uint64_t kN = 300000;
  const auto init = random_floats(kN, 21);
  for (const bool checksums : {false, true}) {
    SCOPED_TRACE(checksums ? "arena checksums on" : "off");
    ArenaAndFrames jobs(*svc_, checksums ? "copied-crc" : "copied", kN * 4, checksums, init);
    OffloadClient& c = jobs.arena;
    OffloadClient& frames = jobs.frames;
    for (uint64_t step = 1; step <= 2; ++step) {
      const auto g = random_floats(kN, 30 + static_cast<uint32_t>(step), 64.0f);
      const uint64_t before = c.requests_sent();
      const auto r = c.push_copied(1, step, 0, DType::fp32, bytes_of(g), c.arena_buffer(kN * 4));
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(c.requests_sent() - before, (kN + 4095) / 4096) << "one request a range";
      EXPECT_TRUE(c.arena_buffer(kN * 4)) << "the slot is free once every range is answered";
      const msg::PushReply f = frames.push_gradients(1, step, 0, DType::fp32, bytes_of(g));
      EXPECT_EQ(r->sum_squares, f.sum_squares);
      EXPECT_EQ(r->nonfinite, f.nonfinite);
      expect_same_commit(c, frames, step);
    }
    const std::vector<float> larger(kN + 1024);  // past the slot's whole pages
    EXPECT_THROW((void)c.push_copied(1, 3, 0, DType::fp32, bytes_of(larger), c.arena_buffer(4)),
                 std::invalid_argument);
    EXPECT_THROW((void)c.push_copied(1, 3, 0, DType::fp32, bytes_of(init), actors::ArenaBuffer{}),
                 std::invalid_argument);
  }
}

// An fp32 gradient rounded into the slot by push_filled, in ranges (8192 half elements each),
// against a frames push of the same gradient rounded beforehand, on a real service, in bf16
// and fp16, arena checksums off and on: the same replies (an fp16 overflow, inf in the slot,
// reported as nonfinite by both) and the same parameters after a commit; every range read the
// right part of the source, and the slot is free once the last range is answered.
TEST_F(OffloadArena, AFilledPushRoundedInRangesEqualsAHalfFramesPush) {
  namespace kc = kernels::cpu;
  constexpr uint64_t kN = 300000;
  const auto init = random_floats(kN, 22);
  for (const DType dtype : {DType::bf16, DType::fp16})
    for (const bool checksums : {false, true}) {
      const std::string job = std::string(msg::to_string(dtype)) + (checksums ? "-crc" : "");
      SCOPED_TRACE(job);
      const kc::HalfKind kind = dtype == DType::bf16 ? kc::HalfKind::kBF16 : kc::HalfKind::kFP16;
      ArenaAndFrames jobs(*svc_, "filled-" + job, kN * 2, checksums, init);
      OffloadClient& c = jobs.arena;
      OffloadClient& frames = jobs.frames;
      for (uint64_t step = 1; step <= 2; ++step) {
        auto g = random_floats(kN, 40 + static_cast<uint32_t>(step), 64.0f);
        if (step == 2) g[kN - 7] = 70000.0f;  // past fp16's largest: inf in fp16 only
        std::vector<uint16_t> half(kN);
        kc::floats_to_half(half.data(), g.data(), kN, kind);
        std::vector<std::pair<uint64_t, uint64_t>> filled;
        auto fill = [&](std::byte* dst, uint64_t at, uint64_t n) {
          filled.emplace_back(at, n);
          kc::floats_to_half_one_thread(reinterpret_cast<uint16_t*>(dst), g.data() + at, n, kind);
        };
        const uint64_t before = c.requests_sent();
        const auto r = c.push_filled(1, step, 0, dtype, kN, fill, c.arena_buffer(kN * 2));
        ASSERT_TRUE(r.ok()) << r.error().message;
        EXPECT_EQ(c.requests_sent() - before, (kN + 8191) / 8192) << "one request a range";
        ASSERT_EQ(filled.size(), (kN + 8191) / 8192);
        for (size_t i = 0; i < filled.size(); ++i)
          EXPECT_EQ(filled[i], (std::pair<uint64_t, uint64_t>{
                                   i * 8192, std::min<uint64_t>(8192, kN - i * 8192)}));
        EXPECT_TRUE(c.arena_buffer(kN * 2)) << "the slot is free once every range is answered";
        const msg::PushReply f = frames.push_gradients(
            1, step, 0, dtype, std::as_bytes(std::span<const uint16_t>(half)));
        EXPECT_EQ(r->sum_squares, f.sum_squares);
        EXPECT_EQ(r->nonfinite, f.nonfinite);
        EXPECT_EQ(r->nonfinite, step == 2 && dtype == DType::fp16);
        if (r->nonfinite) {
          c.skip(step);
          frames.skip(step);
          continue;
        }
        expect_same_commit(c, frames, step);
      }
      const auto no_fill = [](std::byte*, uint64_t, uint64_t) {};
      EXPECT_THROW((void)c.push_filled(1, 3, 0, dtype, kN + 4096, no_fill, c.arena_buffer(4)),
                   std::invalid_argument);
      EXPECT_THROW((void)c.push_filled(1, 3, 0, dtype, kN, no_fill, actors::ArenaBuffer{}),
                   std::invalid_argument);
    }
}

// A real service omits the crc of a fetch that asked for none (writing the same bytes),
// skips the check of a push that omitted its own (and adds it all the same), and refuses a
// slice that claims both a crc and its omission.
TEST_F(OffloadArena, OmittedCrcsAreNeitherComputedNorChecked) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "omitted");
  ASSERT_TRUE(c.map_arena(65536, 2));
  const uint64_t id = c.arena_id();
  c.register_partitions(0, 1, {spec(1, 1024)});
  const auto values = random_floats(1024, 9);
  c.set_parameters(1, 0, DType::fp32, bytes_of(values));
  actors::ArenaBuffer slot = c.arena_buffer(4096);
  ASSERT_TRUE(slot);
  for (const bool omitted : {true, false}) {
    const msg::Header h = c.call(msg::FetchParameters{
        1, 0, DType::fp32, msg::ArenaSlice{id, slot.offset(), 4096, 0, omitted}});
    const auto* reply = std::get_if<msg::FetchReply>(&h.body);
    ASSERT_NE(reply, nullptr) << msg::kind_name(h.body);
    ASSERT_TRUE(reply->arena);
    EXPECT_EQ(reply->arena->crc_omitted, omitted);
    EXPECT_EQ(reply->arena->crc32c, omitted ? 0u : checksum::crc32c(values.data(), 4096));
    expect_bits_equal(values, slot.bytes().first(4096), "the fetch written into the slot");
  }
  const auto g = random_floats(1024, 10);
  std::memcpy(slot.bytes().data(), g.data(), 4096);
  const msg::Header pushed = c.call(msg::PushGradients{
      1, 1, 0, DType::fp32, 1024, msg::ArenaSlice{id, slot.offset(), 4096, 0, true}});
  const auto* r = std::get_if<msg::PushReply>(&pushed.body);
  ASSERT_NE(r, nullptr) << msg::kind_name(pushed.body);
  EXPECT_EQ(r->sum_squares, kernels::cpu::grad_stats(g.data(), g.size()).sum_squares);
  // crc 0 without the omission is a mismatch (these bytes' crc is not 0).
  ASSERT_NE(checksum::crc32c(g.data(), 4096), 0u);
  expect_refused(c.call(msg::PushGradients{1, 1, 1, DType::fp32, 1024,
                                           msg::ArenaSlice{id, slot.offset(), 4096, 0, false}}),
                 ErrorCode::checksumMismatch, "pushGradients.arena", "crc32c");
  expect_refused(c.call(msg::PushGradients{1, 1, 1, DType::fp32, 1024,
                                           msg::ArenaSlice{id, slot.offset(), 4096, 5, true}}),
                 ErrorCode::malformed, "pushGradients.arena.crc32c", "crcOmitted");
}

// The fake service's side of a client's map_arena: the MapArena asking for a ticket, the
// memfd handed over its door, the MapArena naming the ticket, answered as arena `id`.
// Returns the handed memfd, the arena the client created.
msg::UniqueFd map_for_fake(FakeService& fake, const msg::FdDoor& door, uint64_t id) {
  const FakeService::Request ask = fake.next();
  const auto* m = std::get_if<msg::MapArena>(&ask.header.body);
  EXPECT_NE(m, nullptr) << msg::kind_name(ask.header.body);
  if (!m) return msg::UniqueFd(-1);
  EXPECT_TRUE(m->path.empty());
  EXPECT_TRUE(m->ticket.empty());
  fake.answer(ask, msg::MapArenaReply{0, m->size, "ticket-1", door.address()});
  pollfd p{door.fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 60000), 1);
  const msg::UniqueFd conn(::accept(door.fd(), nullptr, nullptr));
  std::string why;
  auto handed = msg::receive_fd(conn.get(), 60s, why);
  EXPECT_TRUE(handed) << why;
  if (!handed) return msg::UniqueFd(-1);
  EXPECT_EQ(handed->ticket, "ticket-1");
  EXPECT_EQ(handed->uid, ::geteuid());
  msg::answer_hand_over(conn.get(), "ok");
  const FakeService::Request map = fake.next();
  m = std::get_if<msg::MapArena>(&map.header.body);
  EXPECT_NE(m, nullptr) << msg::kind_name(map.header.body);
  if (!m) return msg::UniqueFd(-1);
  EXPECT_EQ(m->ticket, "ticket-1");
  fake.answer(map, msg::MapArenaReply{id, m->size, "", ""});
  return std::move(handed->fd);
}

// A client whose arena (`slots` slots of `slot_bytes`) a stand-in service mapped as arena 7;
// `memfd` holds the arena's bytes as that service sees them.
struct MappedAtFake {
  FakeService fake;
  msg::FdDoor door{"dsactor-test-" + std::to_string(getpid())};
  OffloadClient client;
  msg::UniqueFd memfd;
  bool mapped = false;
  MappedAtFake(const std::string& job, bool arena_checksums, size_t slot_bytes, size_t slots)
      : client(fake.endpoint(), fake.client_security(), 60s, job) {
    client.set_arena_checksums(arena_checksums);
    std::future<bool> done =
        std::async(std::launch::async, [&] { return client.map_arena(slot_bytes, slots); });
    memfd = map_for_fake(fake, door, 7);
    mapped = done.get();
  }
};

TEST(OffloadArenaUnmap, ClientUnmapsItsArenaWhenItGoes) {
  FakeService fake;
  const msg::FdDoor door("dsactor-test-" + std::to_string(getpid()));
  std::future<void> mapped_and_gone = std::async(std::launch::async, [&] {
    OffloadClient c(fake.endpoint(), fake.client_security(), 60s, "short-lived");
    EXPECT_TRUE(c.map_arena(4096, 1));
    EXPECT_EQ(c.arena_id(), 42u);
  });
  map_for_fake(fake, door, 42);
  mapped_and_gone.get();
  const FakeService::Request unmap = fake.next();
  const auto* u = std::get_if<msg::UnmapArena>(&unmap.header.body);
  ASSERT_NE(u, nullptr) << msg::kind_name(unmap.header.body);
  EXPECT_EQ(u->arena_id, 42u);
  EXPECT_EQ(unmap.header.job_id, "short-lived");
}

// What a client asks of a service's arena checksums, seen at a stand-in service: with
// arena_checksums off its fetches ask for no crc, a fetch written with a wrong one is handed
// over as written, and a push written in place omits its crc; on, the fetch is checked
// (a wrong crc fails it, naming the partition and both checksums; a reply without one too)
// and the push declares the crc of its bytes.
TEST(OffloadArenaChecksums, WhatTheClientAsksAndChecksFollowsTheSetting) {
  for (const bool on : {false, true}) {
    SCOPED_TRACE(on ? "arena checksums on" : "off");
    MappedAtFake m("checksums", on, 4096, 2);
    ASSERT_TRUE(m.mapped);
    FakeService& fake = m.fake;
    OffloadClient& c = m.client;
    const msg::UniqueFd& memfd = m.memfd;
    std::vector<float> values(64);
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * static_cast<float>(i);
    const uint32_t right = checksum::crc32c(values.data(), 256);
    // The service's write: 64 floats at the slot the fetch named, declared with `crc`.
    auto fetch_answered = [&](uint32_t crc, bool omitted) {
      const uint64_t id = c.send_fetch(3, 0, DType::fp32, 256);
      const FakeService::Request fetch = fake.next();
      const auto* f = std::get_if<msg::FetchParameters>(&fetch.header.body);
      EXPECT_NE(f, nullptr) << msg::kind_name(fetch.header.body);
      EXPECT_TRUE(f && f->arena);
      if (!f || !f->arena) return c.await_fetch(id);
      EXPECT_EQ(f->arena->crc_omitted, !on) << "the fetch asks for a crc only when it checks";
      EXPECT_EQ(::pwrite(memfd.get(), values.data(), 256, static_cast<off_t>(f->arena->offset)),
                256);
      fake.answer(fetch, msg::FetchReply{3, 1, DType::fp32, 64,
                                         msg::ArenaSlice{7, f->arena->offset, 256, crc, omitted}});
      return c.await_fetch(id);
    };
    {
      auto fetched = fetch_answered(right ^ 1u, false);
      if (on) {
        ASSERT_FALSE(fetched.ok());
        const std::string& why = fetched.error().message;
        EXPECT_NE(why.find("partition 3"), std::string::npos) << why;
        EXPECT_NE(why.find(std::to_string(right)), std::string::npos) << why;
        EXPECT_NE(why.find(std::to_string(right ^ 1u)), std::string::npos) << why;
      } else {
        ASSERT_TRUE(fetched.ok()) << fetched.error().message;
        ASSERT_TRUE(fetched->in_arena());
        ASSERT_EQ(fetched->bytes().size(), 256u);
        EXPECT_EQ(std::memcmp(fetched->bytes().data(), values.data(), 256), 0);
      }
    }
    {
      auto fetched = fetch_answered(0, true);
      EXPECT_EQ(fetched.ok(), !on);
      if (on && !fetched.ok()) {
        EXPECT_NE(fetched.error().message.find("without the crc32c"), std::string::npos)
            << fetched.error().message;
      }
    }
    // A push written in place (not copy_in): its crc only when on.
    actors::ArenaBuffer slot = c.arena_buffer(256);
    ASSERT_TRUE(slot);
    std::memcpy(slot.bytes().data(), values.data(), 256);
    c.send_push_gradients(3, 1, 0, DType::fp32, 64, std::move(slot));
    const FakeService::Request push = fake.next();
    const auto* g = std::get_if<msg::PushGradients>(&push.header.body);
    ASSERT_NE(g, nullptr) << msg::kind_name(push.header.body);
    ASSERT_TRUE(g->arena);
    EXPECT_EQ(g->arena->crc_omitted, !on);
    EXPECT_EQ(g->arena->crc32c, on ? right : 0u);
  }
}

// push_copied's ranges at a stand-in service: all three go before any answer, each naming
// its own part of the one slot in order, holding its bytes, with their crc when arena
// checksums are on and without when off; the slot stays taken until the last range is
// answered, whose reply is the push's, and is free after.
TEST(OffloadArenaCopiedPush, RangesHoldTheirSlotUntilTheLastIsAnswered) {
  for (const bool on : {false, true}) {
    SCOPED_TRACE(on ? "arena checksums on" : "off");
    MappedAtFake m("copied", on, 65536, 1);
    ASSERT_TRUE(m.mapped);
    FakeService& fake = m.fake;
    OffloadClient& c = m.client;
    c.set_push_range_bytes(16384);  // 4096 floats a range
    constexpr uint64_t kN = 10000;  // ranges of 4096, 4096 and 1808 floats
    const auto g = random_floats(kN, 40);
    auto pushed = std::async(std::launch::async, [&] {
      return c.push_copied(3, 1, 0, DType::fp32, bytes_of(g), c.arena_buffer(kN * 4));
    });
    std::vector<FakeService::Request> ranges;
    for (int i = 0; i < 3; ++i) ranges.push_back(fake.next());
    uint64_t slot_offset = 0;
    for (uint64_t i = 0; i < 3; ++i) {
      const auto* p = std::get_if<msg::PushGradients>(&ranges[i].header.body);
      ASSERT_NE(p, nullptr) << msg::kind_name(ranges[i].header.body);
      ASSERT_TRUE(p->arena);
      const uint64_t count = std::min<uint64_t>(4096, kN - i * 4096);
      EXPECT_EQ(p->element_count, kN);
      EXPECT_EQ(p->range_offset, i * 4096);
      EXPECT_EQ(p->range_count, count);
      if (i == 0) slot_offset = p->arena->offset;
      EXPECT_EQ(p->arena->offset, slot_offset + i * 4096 * 4);
      EXPECT_EQ(p->arena->length, count * 4);
      EXPECT_EQ(p->arena->crc_omitted, !on);
      EXPECT_EQ(p->arena->crc32c, on ? checksum::crc32c(g.data() + i * 4096, count * 4) : 0u);
      std::vector<float> in_slot(count);
      ASSERT_EQ(
          ::pread(m.memfd.get(), in_slot.data(), count * 4, static_cast<off_t>(p->arena->offset)),
          static_cast<ssize_t>(count * 4));
      EXPECT_EQ(std::memcmp(in_slot.data(), g.data() + i * 4096, count * 4), 0) << "range " << i;
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_FALSE(c.arena_buffer(4)) << "the slot was free with range " << i << " unanswered";
      fake.answer(ranges[i], msg::PushReply{3, 1, 0, i == 2 ? 5.0 : 0.0, false});
    }
    const auto r = pushed.get();
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->sum_squares, 5.0);
    EXPECT_TRUE(c.arena_buffer(4)) << "the slot is free once every range is answered";
  }
}

// A push_copied whose ranges go unanswered fails with the timeout, and its slot stays taken
// (the service may still be reading it) until the late replies come in: then it is free.
TEST(OffloadArenaCopiedPush, AnAbandonedPushKeepsItsSlotUntilTheLateReplies) {
  MappedAtFake m("copied-late", false, 65536, 1);
  ASSERT_TRUE(m.mapped);
  FakeService& fake = m.fake;
  OffloadClient& c = m.client;
  c.set_push_range_bytes(16384);
  c.set_timeout(300ms);
  const auto g = random_floats(10000, 41);
  auto pushed = std::async(std::launch::async, [&] {
    return c.push_copied(3, 1, 0, DType::fp32, bytes_of(g), c.arena_buffer(g.size() * 4));
  });
  std::vector<FakeService::Request> ranges;
  for (int i = 0; i < 3; ++i) ranges.push_back(fake.next());
  const auto r = pushed.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, actors::ServiceFailure::Kind::timeout) << r.error().message;
  EXPECT_FALSE(c.arena_buffer(4)) << "the slot was free with its ranges unanswered";
  for (const auto& range : ranges) fake.answer(range, msg::PushReply{3, 1, 0, 0.0, false});
  // The next round trip reads the late replies that came before its own.
  c.set_timeout(60s);
  const uint64_t skip = c.send(msg::SkipStep{1});
  const FakeService::Request asked = fake.next();
  ASSERT_TRUE(std::holds_alternative<msg::SkipStep>(asked.header.body))
      << msg::kind_name(asked.header.body);
  fake.answer(asked, msg::CommitReply{});
  ASSERT_TRUE(c.await(skip).ok());
  EXPECT_TRUE(c.arena_buffer(4)) << "the late replies gave the slot back";
}

// UnmapArena, answered: the id names nothing afterwards.
TEST_F(OffloadArena, UnmappedArenaNamesNothing) {
  OffloadClient c(svc_->endpoint(), svc_->client_security(), 10s, "unmapped");
  ASSERT_TRUE(c.map_arena(4096, 1));
  const uint64_t id = c.arena_id();
  c.register_partitions(0, 1, {spec(1, 64)});
  OffloadClient other(svc_->endpoint(), svc_->client_security(), 10s,
                      "unmapped");  // same job, another connection
  const auto unmapped = other.call(msg::UnmapArena{id});
  ASSERT_TRUE(std::holds_alternative<msg::UnmapArenaReply>(unmapped.body))
      << msg::kind_name(unmapped.body);
  const msg::Header refused =
      c.call(msg::FetchParameters{1, 0, DType::fp32, msg::ArenaSlice{id, 0, 256, 0}});
  const auto& e = error(refused);
  EXPECT_EQ(e.code, ErrorCode::malformed) << e.message;
  EXPECT_NE(e.message.find("not mapped"), std::string::npos) << e.message;
}

// No arena where none can be had: a remote-looking endpoint (no request at all) or a
// service that maps none (--max-arena 0); everything still works through frames.
TEST(OffloadArenaFallback, FramesWhenTheServiceCannotMap) {
  OffloadClient remote("tcp://192.0.2.1:5555", kInsecure, 100ms);
  EXPECT_FALSE(remote.map_arena(4096, 2));
  TempDir tmp;
  ServiceProcess svc({"--max-arena", "0"}, tmp.path);
  OffloadClient c(svc.endpoint(), svc.client_security(), 10s);
  EXPECT_FALSE(c.map_arena(4096, 2));
  EXPECT_FALSE(c.has_arena());
  EXPECT_FALSE(c.arena_buffer(16));
  c.register_partitions(0, 1, {spec(1, 1000)});
  const auto values = random_floats(1000, 8);
  c.set_parameters(1, 0, DType::fp32, bytes_of(values));
  auto f = c.fetch(1, 0, DType::fp32);
  EXPECT_FALSE(f.in_arena());
  expect_bits_equal(values, f.bytes(), "fetch as a frame");
}

// A trainer killed without UnmapArena (kill -9, then restarted) leaves an arena the
// service unmaps once that process is gone, at the next MapArena: the restarted trainer's
// arena gets its room. The service admits one arena's bytes (--max-arena); a child process
// hands the first over and is killed; the next one is mapped only if the first went.
TEST(OffloadArenaOrphans, AnArenaWhoseProcessExitedIsUnmappedForTheNext) {
  constexpr uint64_t kArena = 1 << 20;
  // The child forks before this test starts a thread, so it may use the allocator.
  int to_child[2], from_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(from_child), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    msg::SharedArena arena(kArena);
    char buf[512] = {};
    size_t got = 0;
    while (got < sizeof(buf) && !std::memchr(buf, '\n', got)) {
      const ssize_t n = ::read(to_child[0], buf + got, sizeof(buf) - got);
      if (n <= 0) ::_exit(2);
      got += static_cast<size_t>(n);
    }
    const std::string line(buf, got);  // "<socket> <ticket>\n"
    const auto space = line.find(' ');
    try {
      msg::hand_over_fd(line.substr(0, space), line.substr(space + 1, line.find('\n') - space - 1),
                        arena.fd(), 10s);
    } catch (...) {
      ::_exit(3);
    }
    (void)!::write(from_child[1], "k", 1);
    ::pause();  // holds the arena until killed
    ::_exit(0);
  }
  TempDir tmp;
  ServiceProcess svc({"--max-arena", std::to_string(kArena)}, tmp.path);
  OffloadClient c(svc.endpoint(), svc.client_security(), 10s, "restarted");
  const msg::Header ticket = c.call(msg::MapArena{"", kArena, ""});
  const auto* t = std::get_if<msg::MapArenaReply>(&ticket.body);
  ASSERT_NE(t, nullptr) << msg::kind_name(ticket.body);
  const std::string line = t->socket + " " + t->ticket + "\n";
  ASSERT_EQ(::write(to_child[1], line.data(), line.size()), static_cast<ssize_t>(line.size()));
  char ok = 0;
  ASSERT_EQ(::read(from_child[0], &ok, 1), 1) << "the child did not hand its arena over";
  const msg::Header mapped = c.call(msg::MapArena{"", kArena, t->ticket});
  ASSERT_TRUE(std::holds_alternative<msg::MapArenaReply>(mapped.body))
      << msg::kind_name(mapped.body);
  // While its process lives, the arena holds the service's whole arena room.
  EXPECT_EQ(error(c.call(msg::MapArena{"", 4096, ""})).code, ErrorCode::tooLarge);
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(c.map_arena(4096, 1)) << "the dead process's arena was not unmapped";
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
}

TEST(SharedArena, LocalEndpoints) {
  EXPECT_TRUE(messages::is_local_endpoint("tcp://127.0.0.1:5555"));
  EXPECT_TRUE(messages::is_local_endpoint("tcp://localhost:5555"));
  EXPECT_TRUE(messages::is_local_endpoint("ipc:///tmp/x"));
  EXPECT_FALSE(messages::is_local_endpoint("tcp://10.0.0.2:5555"));
  EXPECT_FALSE(messages::is_local_endpoint("tcp://127example.com:5555"));
}

}  // namespace
}  // namespace dsactor::offload::test
