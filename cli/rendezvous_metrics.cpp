#include "cli/rendezvous_metrics.h"

namespace dsactor::cli {

void add_rendezvous_metrics(metrics::Registry& registry,
                            std::weak_ptr<const actors::RendezvousServer> server) {
  registry.add_collector([server = std::move(server)](metrics::Registry& r) {
    const auto held = server.lock();
    if (!held) return;
    const actors::RendezvousStats s = held->stats();
    const metrics::Labels actor{{"actor", kRendezvousActor}};
    r.gauge("dsactor_rendezvous_jobs", "Jobs with keys in the rendezvous store", actor)
        .set(static_cast<double>(s.jobs));
    r.gauge("dsactor_rendezvous_keys", "Keys the rendezvous store holds", actor)
        .set(static_cast<double>(s.keys));
    r.gauge("dsactor_rendezvous_parked_requests", "Requests waiting for a key to be set", actor)
        .set(static_cast<double>(s.parked));
    r.gauge("dsactor_rendezvous_bytes", "Bytes of the values the store holds", actor)
        .set(static_cast<double>(s.bytes));
    r.counter("dsactor_rendezvous_refused_requests_total",
              "Requests the store refused (token, quota, malformed)", actor)
        .set_total(static_cast<double>(s.refused_requests));
    r.counter("dsactor_rendezvous_refused_handshakes_total",
              "Handshakes refused (no key, a stranger's key)", actor)
        .set_total(static_cast<double>(s.refused_handshakes));
  });
}

}  // namespace dsactor::cli
