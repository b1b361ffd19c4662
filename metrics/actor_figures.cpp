#include "metrics/actor_figures.h"

namespace dsactor::metrics {

ActorFigures::Handling::Handling(ActorFigures* figures, size_t mailbox_depth) : figures_(figures) {
  if (!figures_) return;
  figures_->mailbox_.store(mailbox_depth, std::memory_order_relaxed);
  start_ = std::chrono::steady_clock::now();
}

ActorFigures::Handling::~Handling() {
  if (!figures_) return;
  const auto spent = std::chrono::steady_clock::now() - start_;
  figures_->handler_nanoseconds_.fetch_add(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(spent).count()),
      std::memory_order_relaxed);
  figures_->messages_.fetch_add(1, std::memory_order_relaxed);
}

void ActorFigures::error(std::string_view what) {
  errors_.fetch_add(1, std::memory_order_relaxed);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::lock_guard lock(error_mutex_);
  last_error_unix_seconds_ = now;
  last_error_.assign(what.substr(0, kMaxErrorText));
}

ActorFigures::Snapshot ActorFigures::snapshot() const {
  Snapshot s;
  s.messages = messages_.load(std::memory_order_relaxed);
  s.handler_seconds =
      static_cast<double>(handler_nanoseconds_.load(std::memory_order_relaxed)) * 1e-9;
  s.mailbox = mailbox_.load(std::memory_order_relaxed);
  s.errors = errors_.load(std::memory_order_relaxed);
  std::lock_guard lock(error_mutex_);
  s.last_error_unix_seconds = last_error_unix_seconds_;
  s.last_error = last_error_;
  return s;
}

ActorFigures& ActorBoard::actor(const std::string& name) {
  std::lock_guard lock(mutex_);
  auto& figures = actors_[name];
  if (!figures) figures = std::make_unique<ActorFigures>();
  return *figures;
}

ActorFigures* figures_of(const std::shared_ptr<ActorBoard>& board, const std::string& name) {
  return board ? &board->actor(name) : nullptr;
}

std::vector<std::string> ActorBoard::names() {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [name, figures] : actors_) out.push_back(name);
  return out;
}

void ActorBoard::publish(const std::shared_ptr<ActorBoard>& board, Registry& registry) {
  registry.add_collector([board](Registry& r) {
    std::lock_guard lock(board->mutex_);
    for (const auto& [name, figures] : board->actors_) {
      const ActorFigures::Snapshot s = figures->snapshot();
      const Labels actor{{"actor", name}};
      r.counter("dsactor_actor_messages_total", "Messages the actor handled", actor)
          .set_total(static_cast<double>(s.messages));
      r.counter("dsactor_actor_handler_seconds_total", "Seconds the actor spent in its handlers",
                actor)
          .set_total(s.handler_seconds);
      r.gauge("dsactor_actor_mailbox_messages",
              "Messages waiting in the actor's mailbox when its last one started", actor)
          .set(static_cast<double>(s.mailbox));
      r.counter("dsactor_actor_errors_total", "Errors the actor's handlers met", actor)
          .set_total(static_cast<double>(s.errors));
      r.gauge("dsactor_actor_last_error_timestamp_seconds",
              "Unix time of the actor's last error (0: none)", actor)
          .set(s.last_error_unix_seconds);
      r.set_text("dsactor_actor_last_error", actor, s.last_error);
    }
  });
}

}  // namespace dsactor::metrics
