#include "offload_service/arena_door.h"

#include <poll.h>
#include <sodium.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "messages/request_channel.h"
#include "security/keyed_mac.h"

namespace dsactor::offload {

namespace {

using Clock = std::chrono::steady_clock;

std::string random_hex(size_t bytes) {
  if (sodium_init() < 0) throw std::runtime_error("libsodium failed to initialize");
  std::vector<uint8_t> b(bytes);
  randombytes_buf(b.data(), b.size());
  return security::to_hex(b);
}

}  // namespace

ArenaDoor::ArenaDoor(std::vector<uid_t> uids)
    : door_("dsactor-offload-" + std::to_string(::getpid()) + "-" + random_hex(8)),
      uids_(std::move(uids)),
      stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!stop_) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  uids_.push_back(::geteuid());
  thread_ = std::thread([this] { serve(); });
}

ArenaDoor::~ArenaDoor() {
  const uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(stop_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
}

void ArenaDoor::serve() {
  std::array<pollfd, 2> fds{{{door_.fd(), POLLIN, 0}, {stop_.get(), POLLIN, 0}}};
  for (;;) {
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    messages::UniqueFd c(::accept4(door_.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c) continue;
    // One at a time: a hand-over is a few syscalls and an mmap; a peer that connects and
    // stays silent holds the door for the receive timeout only.
    if (const std::string line = admit(c.get()); !line.empty())
      messages::answer_hand_over(c.get(), line);
  }
}

std::string ArenaDoor::admit(int connection) {
  std::string why;
  auto handed = messages::receive_fd(connection, std::chrono::seconds(2), why);
  if (!handed) return why;
  if (std::find(uids_.begin(), uids_.end(), handed->uid) == uids_.end()) {
    spdlog::warn("offload: refused an arena fd from pid {} of uid {} (not an allowed user)",
                 handed->pid, handed->uid);
    return "uid " + std::to_string(handed->uid) + " may not hand arenas to this service";
  }
  uint64_t size = 0;
  {
    std::lock_guard lock(mutex_);
    expire_locked();
    auto t = tickets_.find(handed->ticket);
    if (t == tickets_.end() || t->second.handed.mapping) return "unknown or spent ticket";
    if (t->second.view) {
      // A view goes one way: its ticket comes alone, and is spent by being collected.
      if (handed->fd || handed->channel) return "a master view's ticket comes without an fd";
      messages::UniqueFd view = std::move(t->second.view);
      tickets_.erase(t);
      messages::answer_with_fd(connection, view.get());
      return {};
    }
    if (!handed->fd) return "an arena's ticket comes with its fd";
    size = t->second.size;
  }
  if (std::string what;
      handed->channel && !messages::is_request_channel(handed->channel.get(), what))
    return "the second fd is not a request channel: " + what;
  std::shared_ptr<messages::ArenaMapping> mapping;
  try {
    mapping = messages::ArenaMapping::adopt(handed->fd.release(), size);
  } catch (const std::exception& e) {
    return e.what();
  }
  // The process is connected, so its pid is not reused yet: the pidfd tells the service
  // when the trainer is gone, whatever way it went (ArenaTable::unmap_orphans).
  messages::UniqueFd holder(static_cast<int>(::syscall(SYS_pidfd_open, handed->pid, 0)));
  std::lock_guard lock(mutex_);
  auto t = tickets_.find(handed->ticket);
  if (t == tickets_.end() || t->second.handed.mapping) return "unknown or spent ticket";
  t->second.handed =
      Handed{std::move(mapping), std::move(holder), handed->pid, std::move(handed->channel)};
  return "ok";
}

void ArenaDoor::expire_locked() {
  const auto now = Clock::now();
  std::erase_if(tickets_, [&](const auto& t) { return t.second.expires <= now; });
}

std::string ArenaDoor::issue(const std::string& owner, const std::string& job, uint64_t size) {
  return issue_ticket(owner, job, size, {});
}

std::string ArenaDoor::issue_view(const std::string& owner, const std::string& job,
                                  messages::UniqueFd fd) {
  if (!fd) throw std::invalid_argument("ArenaDoor::issue_view: no fd");
  return issue_ticket(owner, job, 0, std::move(fd));
}

std::string ArenaDoor::issue_ticket(const std::string& owner, const std::string& job, uint64_t size,
                                    messages::UniqueFd view) {
  std::lock_guard lock(mutex_);
  expire_locked();
  const auto pending = std::count_if(tickets_.begin(), tickets_.end(),
                                     [&](const auto& t) { return t.second.owner == owner; });
  if (static_cast<size_t>(pending) >= kMaxPendingPerClient)
    throw std::runtime_error("this client holds " + std::to_string(pending) +
                             " arena tickets not yet used; wait for them to expire");
  std::string ticket = random_hex(32);
  tickets_[ticket] = Ticket{owner, job, size, Clock::now() + kTicketLifetime, {}, std::move(view)};
  return ticket;
}

ArenaDoor::Handed ArenaDoor::take(const std::string& ticket, const std::string& owner,
                                  const std::string& job) {
  std::lock_guard lock(mutex_);
  expire_locked();
  auto t = tickets_.find(ticket);
  if (t == tickets_.end() || t->second.owner != owner || t->second.job != job || t->second.view)
    throw std::runtime_error("unknown, spent or expired ticket");
  Ticket got = std::move(t->second);
  tickets_.erase(t);
  if (!got.handed.mapping) throw std::runtime_error("no arena was handed over with the ticket");
  return std::move(got.handed);
}

}  // namespace dsactor::offload
