#pragma once

// The same-host request channels (messages/request_channel.h) a service's gateway reads
// beside its ROUTER socket: each the service's end of a trainer's channel, bound to the
// client key and job of the arena it came with. The arena table attaches one when it maps
// an arena handed over with a channel and detaches it when the arena goes; the gateway
// detaches one whose trainer closed its end. Thread-safe: attach and detach come from the
// coordinator's thread, the gateway reads the list on its own, told of each change by an
// eventfd it polls.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "messages/arena_handoff.h"

namespace dsactor::actors {

class RequestChannels {
 public:
  struct Channel {
    uint64_t id = 0;
    // Shared with the requests read from it: a worker still answering one keeps the
    // socket open after a detach (the answer then goes nowhere).
    std::shared_ptr<const messages::UniqueFd> fd;
    std::string peer;  // the client key the arena was mapped under (Request::peer)
    std::string job;   // the only job whose requests the channel carries
  };

  // Channels one client key may have attached at once (a trainer has one per service): each
  // is an fd the gateway polls, so a key mapping many small arenas cannot run the service
  // out of fds.
  static constexpr size_t kMaxPerClient = 16;

  RequestChannels();
  RequestChannels(const RequestChannels&) = delete;
  RequestChannels& operator=(const RequestChannels&) = delete;

  // Adds `fd` (checked: messages::is_request_channel; std::invalid_argument saying what it
  // is otherwise). Returns its id, or 0 (the fd closed) when `peer` holds kMaxPerClient.
  uint64_t attach(messages::UniqueFd fd, std::string peer, std::string job);
  // Removes channel `id` (unknown ids are ignored: the gateway may have dropped it first).
  void detach(uint64_t id);
  size_t size() const;

  // The gateway's side: an eventfd readable after a change, and the channels as they are
  // now (which also clears the eventfd).
  int changed_fd() const { return changed_.get(); }
  std::vector<Channel> current();

 private:
  void signal();

  messages::UniqueFd changed_;
  mutable std::mutex mutex_;
  std::map<uint64_t, Channel> channels_;
  uint64_t next_id_ = 1;
};

}  // namespace dsactor::actors
