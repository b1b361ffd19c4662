#pragma once
// Per-actor figures for the actors we own (CAF 0.17 has no cheap global hook, so an actor
// opts in by timing its own handlers, one line per handler): messages handled, seconds
// spent in handlers, its mailbox depth when the last message started, and errors with the
// time and text of the newest. An actor holds its ActorFigures by pointer (null: nobody
// asked for metrics, and Handling does nothing); a process keeps every actor's in one
// ActorBoard, which mirrors them into its Registry at scrape time under the label
// actor="NAME", so an actor's handler touches only its own atomics, never the registry.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "metrics/registry.h"

namespace dsactor::metrics {

class ActorFigures {
 public:
  // An error's text is kept up to this many bytes (the newest error only).
  static constexpr size_t kMaxErrorText = 240;

  // Times one handler run: on destruction, one message and its seconds are counted.
  // `figures` null: nothing is counted. `mailbox_depth`: what still waits behind this
  // message.
  class Handling {
   public:
    Handling(ActorFigures* figures, size_t mailbox_depth);
    // The same for a CAF actor `self`, whose mailbox is read only when counted. One line
    // at the top of a handler: `const metrics::ActorFigures::Handling h(figures, self);`
    // The depth is what the actor took from its inbox when it last looked (at the start of
    // this round of messages), not mailbox().size(): that moves the messages sent since
    // into the queue, and CAF 0.17's queue then casts its sentinel node to a message, which
    // the test configuration's UBSan (-fsanitize=vptr) stops a process for whenever messages
    // wait behind a handler (pipelined fetch ranges at a partition worker).
    template <class Actor>
    Handling(ActorFigures* figures, Actor* self)
        : Handling(figures, figures ? self->mailbox().queue().total_task_size() : 0) {}
    ~Handling();
    Handling(const Handling&) = delete;
    Handling& operator=(const Handling&) = delete;

   private:
    ActorFigures* figures_;
    std::chrono::steady_clock::time_point start_;
  };

  // An error the actor met (a request it failed or refused): counted, with its time and
  // text (cut to kMaxErrorText bytes) as the newest.
  void error(std::string_view what);

  struct Snapshot {
    uint64_t messages = 0;
    double handler_seconds = 0;
    uint64_t mailbox = 0;
    uint64_t errors = 0;
    double last_error_unix_seconds = 0;  // 0: none yet
    std::string last_error;
  };
  Snapshot snapshot() const;

 private:
  std::atomic<uint64_t> messages_{0};
  std::atomic<uint64_t> handler_nanoseconds_{0};
  std::atomic<uint64_t> mailbox_{0};
  std::atomic<uint64_t> errors_{0};
  mutable std::mutex error_mutex_;  // an error is rare: a lock is cheap enough
  double last_error_unix_seconds_ = 0;
  std::string last_error_;
};

namespace detail {

// `handler` with the same signature, timed (CAF reads a handler's signature off its
// operator(), so the wrapper spells the parameter types out).
template <class Self, class F, class R, class... Args>
auto timed_handler(Self* self, ActorFigures* figures, F handler, R (F::*)(Args...) const) {
  return [self, figures, handler = std::move(handler)](Args... args) -> R {
    const ActorFigures::Handling handling(figures, self);
    return handler(std::forward<Args>(args)...);
  };
}

template <class Self, class F, class R, class... Args>
auto timed_handler(Self* self, ActorFigures* figures, F handler, R (F::*)(Args...)) {
  return [self, figures, handler = std::move(handler)](Args... args) mutable -> R {
    const ActorFigures::Handling handling(figures, self);
    return handler(std::forward<Args>(args)...);
  };
}

}  // namespace detail

// An actor's behavior whose every handler is timed into `figures` (null: none is): one
// wrapper per behavior, so the handlers themselves stay as they are:
//   return metrics::timed_behavior<behavior_type>(self, figures, [self](a_atom) {...}, ...);
template <class Behavior, class Self, class... Handlers>
Behavior timed_behavior(Self* self, ActorFigures* figures, Handlers... handlers) {
  return Behavior{
      detail::timed_handler(self, figures, std::move(handlers), &Handlers::operator())...};
}

// The actors of one process that count themselves, by name.
class ActorBoard {
 public:
  // The actor's figures, created on first use; the address stays valid for the board's life.
  ActorFigures& actor(const std::string& name);
  // Registers a collector on `registry` that mirrors every actor's figures at each scrape:
  // dsactor_actor_{messages,handler_seconds,errors}_total, dsactor_actor_mailbox_messages,
  // dsactor_actor_last_error_timestamp_seconds, and the text dsactor_actor_last_error
  // (Registry::set_text: in /api/state only, never a label).
  static void publish(const std::shared_ptr<ActorBoard>& board, Registry& registry);
  // The actors on the board, by name.
  std::vector<std::string> names();

 private:
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<ActorFigures>> actors_;
};

// `board->actor(name)`, or null without a board (a process that serves no metrics).
ActorFigures* figures_of(const std::shared_ptr<ActorBoard>& board, const std::string& name);

}  // namespace dsactor::metrics
