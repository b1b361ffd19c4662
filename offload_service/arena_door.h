#pragma once

// Where same-host trainers hand their arena's memfd to the service (messages/arena_handoff.h):
// a Unix socket in the abstract namespace, served by a thread of its own. A MapArena without
// a ticket gets one here (`issue`), bound to the client key and job that asked and to the
// arena's size; the trainer then sends the ticket and the fd over the socket, where the
// connecting process's uid must be the service's own or an allowed one (SO_PEERCRED); the
// fd is checked and mapped (messages::ArenaMapping::adopt) and kept under its ticket; the
// MapArena that carries the ticket then `take`s the mapping, once. Tickets are random
// (32 bytes), single-use, and expire after kTicketLifetime; a client holds at most
// kMaxPendingPerClient at once.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "messages/arena_handoff.h"
#include "messages/shm_arena.h"

namespace dsactor::offload {

class ArenaDoor {
 public:
  static constexpr std::chrono::seconds kTicketLifetime{30};
  static constexpr size_t kMaxPendingPerClient = 16;

  // Binds a fresh abstract socket and starts its thread. `uids`: user ids besides our own
  // whose processes may hand over an fd.
  explicit ArenaDoor(std::vector<uid_t> uids);
  // Stops the thread; mappings not taken are unmapped.
  ~ArenaDoor();
  ArenaDoor(const ArenaDoor&) = delete;
  ArenaDoor& operator=(const ArenaDoor&) = delete;

  // "@name", what MapArenaReply.socket carries.
  const std::string& address() const { return door_.address(); }

  // A ticket for an arena of `size` bytes of (owner, job). Throws std::runtime_error when
  // the client holds kMaxPendingPerClient tickets already.
  std::string issue(const std::string& owner, const std::string& job, uint64_t size);
  // A ticket for the read-only fd of a partition's master (FetchReply::master_view), counted
  // against `owner`'s bound and sent only in a reply to (owner, job). The door sees no key:
  // the first process of an allowed uid to present it collects the fd (messages::collect_fd),
  // once. Same lifetime and per-client bound as arena tickets.
  std::string issue_view(const std::string& owner, const std::string& job, messages::UniqueFd fd);
  // An arena as handed over: the mapping, and the process that handed it (a pidfd, which
  // becomes readable when that process exits; empty where the kernel has no pidfd_open).
  struct Handed {
    std::shared_ptr<messages::ArenaMapping> mapping;
    messages::UniqueFd holder;
    pid_t pid = 0;
    // The service's end of the trainer's request channel, when one came with the arena's fd
    // (checked: messages::is_request_channel).
    messages::UniqueFd channel;
  };
  // The arena handed over with `ticket`, which must have been issued to (owner, job) and
  // used once; the ticket is spent then, handed over or not. Throws std::runtime_error
  // saying why not.
  Handed take(const std::string& ticket, const std::string& owner, const std::string& job);

 private:
  struct Ticket {
    std::string owner, job;
    uint64_t size = 0;
    std::chrono::steady_clock::time_point expires;
    Handed handed;            // once handed over
    messages::UniqueFd view;  // a view ticket's fd, given to whoever collects it
  };
  void serve();
  // One connection: credentials, ticket, fd; the answer line (empty: answered already, with
  // a view's fd).
  std::string admit(int connection);
  std::string issue_ticket(const std::string& owner, const std::string& job, uint64_t size,
                           messages::UniqueFd view);
  void expire_locked();

  messages::FdDoor door_;
  std::vector<uid_t> uids_;
  messages::UniqueFd stop_;  // eventfd
  std::mutex mutex_;
  std::map<std::string, Ticket> tickets_;
  std::thread thread_;
};

}  // namespace dsactor::offload
