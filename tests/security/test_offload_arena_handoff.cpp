// The same-host arena's memfd reaches the service only over its Unix socket, with a ticket
// from an authenticated MapArena. Replayed against a real keyed service: a client asks it
// to map another process's sealed memfd by its /proc/<pid>/fd path (refused, and that
// process's memory untouched), a second key uses the victim's ticket (refused), the
// credentials the service sees are the peer's, and the trainer's own arena still works.

#include <gtest/gtest.h>
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

}  // namespace
}  // namespace dsactor::offload::test
