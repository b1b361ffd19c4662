#pragma once
// Per-actor figures for an actor we own (CAF 0.17 has no cheap global hook, so an actor
// opts in by timing its own handlers): messages handled, seconds spent in handlers, its
// mailbox depth after each message, and errors with the time of the last one. Series
// carry the label actor="NAME", which the dashboard groups by.
#include <chrono>
#include <cstddef>
#include <string>

#include "metrics/registry.h"

namespace dsactor::metrics {

class ActorFigures {
 public:
  ActorFigures(Registry& registry, const std::string& actor);

  // Times one handler run: on destruction, one message and its seconds are counted.
  class Handling {
   public:
    explicit Handling(ActorFigures& figures)
        : figures_(figures), start_(std::chrono::steady_clock::now()) {}
    ~Handling();
    Handling(const Handling&) = delete;
    Handling& operator=(const Handling&) = delete;

   private:
    ActorFigures& figures_;
    std::chrono::steady_clock::time_point start_;
  };

  // What the mailbox still holds (the owner reads it after a message: mailbox().size()).
  void mailbox_depth(size_t messages) { mailbox_.set(static_cast<double>(messages)); }
  void error();

 private:
  Counter& messages_;
  Counter& handler_seconds_;
  Gauge& mailbox_;
  Counter& errors_;
  Gauge& last_error_;
};

}  // namespace dsactor::metrics
