#pragma once

// The offload service process minus main(): a CAF actor system with the ZeroMQ gateway
// (actors/runtime/gateway.h) in front of the store's actors (store_actors.h): the step
// coordinator that every request reaches in wire order, the partition workers, nvme_io
// and metadata. All of them are detached (own threads) because their handlers run the
// optimizer pass, NVMe I/O and RocksDB writes, or wait on each other's replies, which
// would otherwise block the scheduler's few threads.

#include <memory>
#include <string>

#include "actors/runtime/gateway.h"
#include "messages/codec.h"
#include "offload_service/partition_store.h"
#include "offload_service/service_phases.h"
#include "security/transport_security.h"

namespace dsactor::offload {

struct ServiceOptions {
  StoreOptions store;
  // ROUTER endpoint; "tcp://127.0.0.1:*" binds a free port (see OffloadService::endpoint()).
  std::string listen = "tcp://127.0.0.1:5555";
  // What the gateway's decoder accepts. Its max_payload_bytes is lowered to
  // StoreOptions::max_partition_bytes (a frame never needs more).
  messages::Limits limits;
  // The gateway's keypair and the client keys it admits, or insecure (plain ZeroMQ; the
  // constructor refuses that anywhere but on loopback: security::check_listen_security).
  // Default: insecure, for in-process tests and tools; `dsactor start` requires keys or
  // --insecure.
  security::ServerSecurity security = {true, {}, {}};
};

class OffloadService {
 public:
  // Opens the store and starts serving; throws std::runtime_error when the store or the
  // listen address cannot be used.
  explicit OffloadService(ServiceOptions options);
  // stop().
  ~OffloadService();
  OffloadService(const OffloadService&) = delete;
  OffloadService& operator=(const OffloadService&) = delete;

  const std::string& endpoint() const;
  // The store's pinning and why (for the startup log line).
  const std::string& pinning_report() const;
  // Partition workers in use (StoreOptions::workers resolved).
  size_t workers() const;
  // The store's figures (Stats, asked of the step coordinator: it answers after the
  // requests queued before) and the gateway's request counts, for the metrics.
  StoreStats stats() const;
  const actors::GatewayCounters& gateway_counters() const;
  // Where the store's time went, per phase, since the service started.
  const ServicePhases& phases() const;
  // Stops accepting requests, lets the store's actors finish what they are running, and
  // shuts the actor system down; idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsactor::offload
