#pragma once

// The key-value store that trainers rendezvous through: our own small ZeroMQ service (no
// shared files, no Redis), so the coordinator can serve it from inside trainer rank 0 or a
// `--role coordinator` process. RendezvousClient implements gloo::rendezvous::Store, so a
// Gloo context connects its full mesh through it; the same store hands out ranks to
// processes that were not told theirs (the join protocol) and broadcasts small blobs (the
// NCCL unique id).
//
// Who may use it: the socket speaks CurveZMQ (Ironhouse: a client must hold a key on the
// server's allow-list; the server's own key is always on it), and every request carries its
// job's token. A job is bound to the token of its first request, or, when the server was
// given one, every job must carry that one; any other token is refused with a message that
// reveals nothing about the job. Jobs, keys, bytes and parked requests are capped
// (RendezvousServerOptions), a wait's timeout is clamped to a day, and ranks move only
// through join (assign_rank): no set, add or del can change who gets which rank.
//
// Keys live in a namespace per job id, so one server can serve several jobs (and the tests
// can reuse one server). Values are opaque bytes. The wire format is private
// (rendezvous_protocol.h). A get/wait whose keys are missing is parked on the server until
// they are set or its timeout passes, so waiting costs no polling traffic.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>
#include <zmq.hpp>

#include "security/transport_security.h"

namespace dsactor::security {
class ZapHandler;
}
namespace dsactor::actors::rendezvous {
struct Request;
}

namespace dsactor::actors {

// A store request failed: a key did not appear within the timeout, the server did not
// answer, or it refused the request. The message names the key(s), job and endpoint.
class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RendezvousServerOptions {
  // When set, the one job token every request must carry (the coordinator of one run).
  // Unset: each job is bound to the token of its first request.
  std::optional<std::string> job_token;
  // Largest accepted message (ZMQ_MAXMSGSIZE): bounds a hostile or broken client's frames
  // before they are allocated. Gloo's addresses are ~100 bytes a rank; NCCL's id is 128.
  int64_t max_message_bytes = int64_t{1} << 20;
  size_t max_jobs = 64;  // a full table drops an idle job, else refuses
  size_t max_keys_per_job = size_t{1} << 16;
  uint64_t max_bytes_per_job = uint64_t{64} << 20;  // keys + values
  uint64_t max_total_bytes = uint64_t{256} << 20;   // over every job
  size_t max_parked = 4096;  // get/wait requests waiting for keys, over every job
  // A get/wait's timeout is clamped to this (never more than a day).
  std::chrono::milliseconds max_wait = std::chrono::hours(24);
  // When the job table is full, a job idle this long (nothing parked) makes room for a new one.
  std::chrono::milliseconds idle_job_expiry = std::chrono::minutes(10);
};

// What the server holds and has refused: for tests, logs and bounds checks.
struct RendezvousStats {
  size_t jobs = 0, keys = 0, parked = 0;
  uint64_t bytes = 0;
  uint64_t refused_requests = 0;    // refused by the store (token, quota, malformed)
  uint64_t refused_handshakes = 0;  // refused by the ZAP handler (no key, a stranger's key)
};

// ROUTER socket served on its own thread from construction until destruction.
class RendezvousServer {
 public:
  // endpoint: "tcp://127.0.0.1:*" picks a free port; see endpoint() for the bound one.
  // Binding happens here, so a taken port throws at once (RendezvousError). A plain
  // (insecure) server binds loopback only (std::invalid_argument otherwise) and warns.
  RendezvousServer(std::string endpoint, security::ServerSecurity security,
                   RendezvousServerOptions options = {});
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  // The endpoint clients connect to, with the real port.
  const std::string& endpoint() const { return endpoint_; }
  // The server's public key (what a client names as the server it expects); "" when insecure.
  const std::string& public_key() const { return public_key_; }
  RendezvousStats stats() const;
  // Waits until `done(stats())` holds (woken by every change the server thread makes) or
  // `timeout` passes; whether it held. For tests and tools that wait on the store's state.
  bool wait_for(const std::function<bool(const RendezvousStats&)>& done,
                std::chrono::milliseconds timeout) const;

  struct Counters;  // what stats() reads, updated by the server thread (defined in the .cpp)

 private:
  void serve();

  RendezvousServerOptions options_;
  std::string public_key_;
  zmq::context_t context_;
  std::unique_ptr<security::ZapHandler> zap_;  // before socket_: outlives it
  zmq::socket_t socket_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<Counters> counters_;
  std::thread thread_;
};

// DEALER client scoped to one job. Not thread-safe: one client per thread (Gloo only uses
// the store from the thread that calls connectFullMesh).
class RendezvousClient : public gloo::rendezvous::Store {
 public:
  // security: this client's keys and the server's public key (or insecure). job_token: the
  // run's token, sent with every request. timeout: default for get/wait and for every
  // server round trip. Connecting never blocks; the first request waits for the server up
  // to the timeout.
  RendezvousClient(std::string endpoint, std::string job, security::ClientSecurity security,
                   std::string job_token,
                   std::chrono::milliseconds timeout = std::chrono::seconds(30));
  ~RendezvousClient() override;
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  const std::string& job() const { return job_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // gloo::rendezvous::Store. set overwrites; get blocks until the key exists, up to the
  // client's timeout, then throws RendezvousError naming the key, job and endpoint.
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout);
  // Atomically adds delta to the counter at key (missing counts as 0) and returns the new
  // value. The counter is stored as 8 little-endian bytes.
  int64_t add(const std::string& key, int64_t delta);
  // Removes key; returns whether it existed.
  bool remove(const std::string& key);
  // The join protocol: this process's rank in `group` (0..world_size-1 in joining order).
  // Throws when world_size processes have joined already, or with another world size.
  int join(const std::string& group, int world_size);

 private:
  // One round trip (the request's id, job and token filled in here); returns the reply
  // payload. `wait_ms` is how long the server may park the request (0 for requests that
  // never wait).
  std::string call(rendezvous::Request& request, std::chrono::milliseconds wait_ms,
                   const std::string& what);

  std::string endpoint_;
  std::string job_;
  std::string token_;
  bool insecure_;
  std::chrono::milliseconds timeout_;
  uint64_t next_id_ = 1;
  zmq::context_t context_;
  zmq::socket_t socket_;
};

// One keypair for the server and every client (a server always admits its own key): how
// ranks that share one secret key file meet, and how in-process users (benchmarks, tests)
// get an authenticated store without key files.
struct SharedKeySecurity {
  security::ServerSecurity server;
  security::ClientSecurity client;
};
SharedKeySecurity shared_key_security(const security::CurveKeypair& keys);

// Rank for a process that was not told its own: the n-th process to call this for the job
// gets n-1 (0..world_size-1, each exactly once), through the store's join protocol. Throws
// when more than world_size processes ask, naming the job. `group` lets one job hold
// several rank groups.
int assign_rank(RendezvousClient& client, int world_size,
                const std::string& group = "dsactor/ranks");

// Root publishes `blob` under key; every other rank waits for it (up to the client's
// timeout) and gets it back. Returns the blob on every rank. Used for the NCCL unique id.
std::vector<char> broadcast_blob(RendezvousClient& client, const std::string& key, int rank,
                                 int root, const std::vector<char>& blob = {});

}  // namespace dsactor::actors
