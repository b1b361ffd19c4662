#include "offload_service/service.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "actors/runtime/gateway.h"
#include "actors/runtime/runtime.h"
#include "messages/shm_arena.h"
#include "offload_service/step_coordinator.h"
#include "offload_service/store_actors.h"

namespace dsactor::offload {

struct OffloadService::Impl {
  // Every actor of the service is detached (own thread): the scheduler only idles.
  actors::Runtime runtime{{.block_when_idle = true}};
  // Two I/O threads: CurveZMQ encrypts a whole reply on the I/O thread of its connection,
  // and a trainer's heartbeat connection, placed on the other thread, is answered meanwhile.
  zmq::context_t context{2};
  // Same-host trainers' request channels: the arena table attaches them, the gateway reads.
  std::shared_ptr<actors::RequestChannels> channels = std::make_shared<actors::RequestChannels>();
  StoreActors store;
  std::unique_ptr<actors::Gateway> gateway;
  bool stopped = false;
};

OffloadService::OffloadService(ServiceOptions options) : impl_(std::make_unique<Impl>()) {
  security::check_listen_security(options.listen, messages::is_local_endpoint(options.listen),
                                  options.security, "offload service");
  options.store.verify_arena_checksum = options.limits.verify_checksum;
  impl_->store = spawn_store(impl_->runtime.system(), options.store, impl_->channels);
  const StoreOptions& st = options.store;
  actors::GatewayOptions g;
  g.listen = options.listen;
  g.limits = options.limits;
  // A push's payload crc is checked by the worker, inside its accumulate pass where it can
  // be (partition_worker.cpp): one pass over the gradient instead of two.
  g.limits.defer_push_checksum = true;
  g.limits.max_payload_bytes = std::min(g.limits.max_payload_bytes, st.max_partition_bytes);
  g.security = options.security;
  g.name = "offload service";
  g.figures = metrics::figures_of(st.actors, "gateway");
  g.channels = impl_->channels;
  g.inflight = {st.max_requests_in_flight, st.max_bytes_in_flight_per_client,
                st.max_bytes_in_flight};
  // Heartbeats are answered at once, with the progress of the job's operation in flight.
  g.answer_inline = [progress = impl_->store.progress](
                        const messages::Header& h,
                        const std::string& peer) -> std::optional<messages::Body> {
    if (!std::holds_alternative<messages::Ping>(h.body)) return std::nullopt;
    return progress->pong(h, peer);
  };
  try {
    // The gateway sees only the request_handler part of the coordinator's interface.
    impl_->gateway = std::make_unique<actors::Gateway>(
        impl_->runtime.system(), impl_->context, g,
        caf::actor_cast<actors::request_handler>(impl_->store.coordinator));
  } catch (...) {
    impl_->store.stop();
    throw;
  }
}

OffloadService::~OffloadService() {
  stop();
}

const std::string& OffloadService::endpoint() const {
  return impl_->gateway->endpoint();
}

size_t OffloadService::workers() const {
  return impl_->store.workers.size();
}

const std::string& OffloadService::pinning_report() const {
  return impl_->store.pinning_report;
}

StoreStats OffloadService::stats() const {
  return detail::call<StoreStats>(impl_->runtime.system(), impl_->store.coordinator,
                                  stats_atom::value);
}

const actors::GatewayCounters& OffloadService::gateway_counters() const {
  return impl_->gateway->counters();
}

const ServicePhases& OffloadService::phases() const {
  return *impl_->store.phases;
}

void OffloadService::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->gateway->stop();
  impl_->store.stop();
  impl_->runtime.system().await_all_actors_done();
}

}  // namespace dsactor::offload
