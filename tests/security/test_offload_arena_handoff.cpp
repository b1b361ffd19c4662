// The same-host arena's memfd reaches the service only over its Unix socket, with a ticket
// from an authenticated MapArena. Replayed against a real keyed service: a client asks it
// to map another process's sealed memfd by its /proc/<pid>/fd path (refused, and that
// process's memory untouched), a second key uses the victim's ticket (refused), the
// credentials the service sees are the peer's, and the trainer's own arena still works. A
// partition's master view goes the other way: its fd is read-only, collected once with a
// ticket that nothing else accepts.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "messages/arena_handoff.h"
#include "messages/shm_arena.h"
#include "tests/security/offload_attack_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using msg::ErrorCode;

class OffloadArenaHandoff : public OffloadAttack {
 protected:
  void SetUp() override { start(); }
};

TEST_F(OffloadArenaHandoff, AnotherProcessesMemfdIsNeverOpenedByPath) {
  // Another process of this user, holding a sealed memfd with its secrets.
  msg::SharedArena victim_memory(1 << 16);
  std::memset(victim_memory.data(), 0x5a, victim_memory.size());
  int ready[2], done[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // holds the memfd (inherited) until told to go
    char c = 1;
    [[maybe_unused]] auto w = ::write(ready[1], &c, 1);
    [[maybe_unused]] auto r = ::read(done[0], &c, 1);
    ::_exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const std::string path =
      "/proc/" + std::to_string(child) + "/fd/" + std::to_string(victim_memory.fd());
  for (const auto& [who, security] :
       {std::pair{"another client's key", stranger()},
        std::pair{"the victim's own key", service_->client_security()}}) {
    SCOPED_TRACE(who);
    auto attacker = client(security, "arena-thief");
    const msg::Header h = attacker->call(msg::MapArena{path, victim_memory.size(), ""});
    const auto* e = std::get_if<msg::ErrorReply>(&h.body);
    ASSERT_NE(e, nullptr) << msg::kind_name(h.body);
    EXPECT_EQ(e->code, ErrorCode::malformed) << e->message;
    EXPECT_NE(e->message.find("never opened by path"), std::string::npos) << e->message;
  }
  for (size_t i = 0; i < victim_memory.size(); ++i)
    ASSERT_EQ(static_cast<unsigned char>(victim_memory.data()[i]), 0x5a) << i;
  c = 0;
  ASSERT_EQ(::write(done[1], &c, 1), 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  expect_victim_untouched();
}

TEST_F(OffloadArenaHandoff, ATicketIsTheJobsAndKeysThatAskedForIt) {
  msg::SharedArena arena(1 << 16);
  const msg::Header h = victim_->call(msg::MapArena{"", arena.size(), ""});
  const auto* t = std::get_if<msg::MapArenaReply>(&h.body);
  ASSERT_NE(t, nullptr) << msg::kind_name(h.body);
  ASSERT_EQ(t->socket.rfind("@", 0), 0u) << t->socket;
  msg::hand_over_fd(t->socket, t->ticket, arena.fd(), 10s);
  // Another key on its own job of the same arena size: the ticket names nothing.
  auto thief = client(stranger(), "thief");
  const msg::Header stolen = thief->call(msg::MapArena{"", arena.size(), t->ticket});
  const auto* e = std::get_if<msg::ErrorReply>(&stolen.body);
  ASSERT_NE(e, nullptr) << msg::kind_name(stolen.body);
  EXPECT_EQ(e->code, ErrorCode::malformed) << e->message;
  EXPECT_EQ(e->message.find(t->ticket), std::string::npos) << e->message;
  // A made-up ticket handed over with an fd is refused at the socket.
  try {
    msg::hand_over_fd(t->socket, std::string(64, 'f'), arena.fd(), 10s);
    ADD_FAILURE() << "a made-up ticket was accepted";
  } catch (const std::runtime_error& err) {
    EXPECT_NE(std::string(err.what()).find("unknown or spent ticket"), std::string::npos)
        << err.what();
  }
  // The victim's mapping works, once.
  const msg::Header mapped = victim_->call(msg::MapArena{"", arena.size(), t->ticket});
  ASSERT_TRUE(std::holds_alternative<msg::MapArenaReply>(mapped.body))
      << msg::kind_name(mapped.body);
  const uint64_t id = std::get<msg::MapArenaReply>(mapped.body).arena_id;
  EXPECT_NE(id, 0u);
  // The stranger cannot use (or unmap) the victim's arena, even on a job of its own.
  auto own = client(stranger(), "thief-job");
  own->register_partitions(0, 1, {spec(1, 16)});
  const msg::Header use =
      own->call(msg::FetchParameters{1, 0, msg::DType::fp32, msg::ArenaSlice{id, 0, 64, 0}});
  ASSERT_TRUE(std::holds_alternative<msg::ErrorReply>(use.body));
  EXPECT_TRUE(std::holds_alternative<msg::ErrorReply>(own->call(msg::UnmapArena{id}).body));
  expect_victim_untouched();
}

// The victim's trainer maps its master read-only: its pages cannot be made writable, and the
// collected fd writes, resizes and seals nothing. The ticket is collected once, never with an
// fd of the collector's, and is no arena's ticket.
TEST_F(OffloadArenaHandoff, AMasterViewIsReadOnlyAndItsTicketIsCollectedOnce) {
  ASSERT_TRUE(victim_->map_arena(kVictimElements * 4, 2));
  victim_->set_master_views(true);
  {
    auto f = victim_->fetch(kVictimPartition, 1, msg::DType::fp32);
    ASSERT_TRUE(f.in_view());
    const auto bytes = f.bytes();
    void* page = const_cast<std::byte*>(bytes.data());
    EXPECT_NE(::mprotect(page, bytes.size(), PROT_READ | PROT_WRITE), 0)
        << "a master view's pages were made writable";
    EXPECT_EQ(errno, EACCES);
  }
  // The request by hand, to hold the ticket.
  msg::FetchParameters ask{kVictimPartition, 1, msg::DType::fp32,
                           msg::ArenaSlice{victim_->arena_id(), 0, kVictimElements * 4, 0, true}};
  ask.accept_master_view = true;
  const msg::Header h = victim_->call(ask);
  const auto* r = std::get_if<msg::FetchReply>(&h.body);
  ASSERT_NE(r, nullptr) << msg::kind_name(h.body);
  ASSERT_TRUE(r->master_view);
  const msg::MasterView v = *r->master_view;
  ASSERT_FALSE(v.ticket.empty());
  auto refused = [&](const std::function<void()>& attempt, const std::string& why) {
    try {
      attempt();
      ADD_FAILURE() << "accepted: " << why;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  // A made-up ticket, and the view's ticket handed in with an fd of the caller's.
  refused([&] { msg::collect_fd(v.socket, std::string(64, 'e'), 10s); }, "unknown or spent ticket");
  msg::SharedArena mine(4096);
  refused([&] { msg::hand_over_fd(v.socket, v.ticket, mine.fd(), 10s); }, "comes without an fd");
  // Nor is it an arena's ticket, for the victim or anyone.
  auto stranger_client = client(stranger(), kVictimJob);
  for (auto* c : {victim_.get(), stranger_client.get()}) {
    const msg::Header m = c->call(msg::MapArena{"", 4096, v.ticket});
    EXPECT_TRUE(std::holds_alternative<msg::ErrorReply>(m.body)) << msg::kind_name(m.body);
  }
  msg::UniqueFd fd = msg::collect_fd(v.socket, v.ticket, 10s);
  ASSERT_TRUE(fd);
  refused([&] { msg::collect_fd(v.socket, v.ticket, 10s); }, "unknown or spent ticket");
  EXPECT_EQ(::fcntl(fd.get(), F_GETFL) & O_ACCMODE, O_RDONLY);
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0), MAP_FAILED);
  const char junk[8] = {};
  EXPECT_LT(::pwrite(fd.get(), junk, sizeof(junk), 0), 0);
  EXPECT_NE(::ftruncate(fd.get(), 0), 0);
  EXPECT_NE(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  // What it maps is the victim's master as the victim fetches it.
  void* ro = ::mmap(nullptr, kVictimElements * 4, PROT_READ, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(ro, MAP_FAILED);
  const auto fetched = victim_->fetch(kVictimPartition, 1, msg::DType::fp32);
  EXPECT_EQ(std::memcmp(ro, fetched.bytes().data(), kVictimElements * 4), 0);
  ::munmap(ro, kVictimElements * 4);
  expect_victim_untouched();
}

}  // namespace
}  // namespace dsactor::offload::test
