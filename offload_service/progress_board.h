#pragma once

// The operation each job has in flight on the step coordinator, and how far it has got,
// readable from the gateway's thread: a Ping is answered from here at once (the
// coordinator may be busy with that very operation for minutes), so a trainer's timeout
// measures silence, not work. One entry per job at most, and only while an operation runs,
// plus one for a checkpoint written in the background (checkpoint_writer.h), reported while
// the coordinator runs nothing for the job; a Ping learns the progress of its own job, and
// only when it comes from the key that owns it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "messages/codec.h"

namespace dsactor::offload {

class ProgressBoard {
 public:
  struct Entry {
    std::string owner;      // the requester's key
    std::string operation;  // the request's kind ("commitStep", "checkpoint", ...)
    uint64_t step = 0;
    uint64_t total = 0;  // partitions the operation goes through
    std::shared_ptr<std::atomic<uint64_t>> done = std::make_shared<std::atomic<uint64_t>>(0);
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  };

  // The coordinator's operation, or the checkpoint writer's.
  enum class Slot { kForeground, kBackground };

  // The operation's entry for as long as it runs.
  class Scope {
   public:
    Scope(ProgressBoard& board, std::string job, Entry entry, Slot slot = Slot::kForeground);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    // What the workers count into.
    const std::shared_ptr<std::atomic<uint64_t>>& done() const { return done_; }

   private:
    ProgressBoard& board_;
    std::string job_;
    Slot slot_;
    std::shared_ptr<std::atomic<uint64_t>> done_;
  };

  // The answer to a Ping on `h.job_id` from `peer`.
  messages::Pong pong(const messages::Header& h, const std::string& peer) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, Entry> jobs_;
  std::map<std::string, Entry> background_;
};

}  // namespace dsactor::offload
