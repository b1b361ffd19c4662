#include "metrics/actor_figures.h"

namespace dsactor::metrics {

ActorFigures::ActorFigures(Registry& r, const std::string& actor)
    : messages_(r.counter("dsactor_actor_messages_total", "Messages the actor handled",
                          {{"actor", actor}})),
      handler_seconds_(r.counter("dsactor_actor_handler_seconds_total",
                                 "Seconds the actor spent in its handlers", {{"actor", actor}})),
      mailbox_(r.gauge("dsactor_actor_mailbox_messages",
                       "Messages waiting in the actor's mailbox after its last one",
                       {{"actor", actor}})),
      errors_(r.counter("dsactor_actor_errors_total", "Errors the actor's handlers raised",
                        {{"actor", actor}})),
      last_error_(r.gauge("dsactor_actor_last_error_timestamp_seconds",
                          "Unix time of the actor's last error (0: none)", {{"actor", actor}})) {}

ActorFigures::Handling::~Handling() {
  figures_.messages_.add();
  figures_.handler_seconds_.add(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
}

void ActorFigures::error() {
  errors_.add();
  last_error_.set(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
}

}  // namespace dsactor::metrics
