#include "actors/runtime/request_channels.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "messages/request_channel.h"

namespace dsactor::actors {

RequestChannels::RequestChannels() : changed_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!changed_) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
}

uint64_t RequestChannels::attach(messages::UniqueFd fd, std::string peer, std::string job) {
  std::string why;
  if (!fd || !messages::is_request_channel(fd.get(), why))
    throw std::invalid_argument("request channel: " + (fd ? why : std::string("no fd")));
  uint64_t id;
  {
    std::lock_guard lock(mutex_);
    const auto held = std::count_if(channels_.begin(), channels_.end(),
                                    [&](const auto& c) { return c.second.peer == peer; });
    if (static_cast<size_t>(held) >= kMaxPerClient) return 0;
    id = next_id_++;
    channels_[id] = Channel{id, std::make_shared<const messages::UniqueFd>(std::move(fd)),
                            std::move(peer), std::move(job)};
  }
  signal();
  return id;
}

void RequestChannels::detach(uint64_t id) {
  {
    std::lock_guard lock(mutex_);
    if (channels_.erase(id) == 0) return;
  }
  signal();
}

size_t RequestChannels::size() const {
  std::lock_guard lock(mutex_);
  return channels_.size();
}

std::vector<RequestChannels::Channel> RequestChannels::current() {
  uint64_t count;
  [[maybe_unused]] auto n = ::read(changed_.get(), &count, sizeof count);
  std::lock_guard lock(mutex_);
  std::vector<Channel> out;
  out.reserve(channels_.size());
  for (const auto& [id, c] : channels_) out.push_back(c);
  return out;
}

void RequestChannels::signal() {
  const uint64_t one = 1;
  // EAGAIN: the counter is already non-zero, the gateway looks anyway.
  [[maybe_unused]] auto n = ::write(changed_.get(), &one, sizeof one);
}

}  // namespace dsactor::actors
