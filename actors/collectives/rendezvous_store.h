#pragma once

// The key-value store that trainers rendezvous through: our own small ZeroMQ service (no
// shared files, no Redis), so the coordinator can serve it from inside trainer rank 0 or a
// `--role coordinator` process. RendezvousClient implements gloo::rendezvous::Store, so a
// Gloo context connects its full mesh through it; the same store hands out ranks to
// processes that were not told theirs and broadcasts small blobs (the NCCL unique id).
//
// Keys live in a namespace per job id, so one server can serve several jobs (and the tests
// can reuse one server). Values are opaque bytes.
//
// Wire format (private to rendezvous_store.cpp; DEALER -> ROUTER, one multipart message
// per request, every number little-endian u64/i64):
//   request: [request id][op][job][args...]  op is "set", "get", "wait", "add" or "del"
//     set: [key][value]   get: [timeout ms][key]   wait: [timeout ms][key]...
//     add: [key][delta]   del: [key]
//   reply:   [request id][status][payload]    status is "ok", "timeout" or "error"
// A get/wait whose keys are missing is parked on the server until they are set or its
// timeout passes, so waiting costs no polling traffic.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>
#include <zmq.hpp>

namespace dsactor::actors {

// A store request failed: a key did not appear within the timeout, the server did not
// answer, or it refused the request. The message names the key(s), job and endpoint.
class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RendezvousServerOptions {
  // Largest accepted message (ZMQ_MAXMSGSIZE): bounds a hostile or broken client's frames
  // before they are allocated. Gloo addresses and NCCL ids are well under 1 KiB.
  int64_t max_message_bytes = 16 << 20;
  // Most keys one job may hold; a set beyond it is refused.
  size_t max_keys_per_job = 1 << 16;
};

// ROUTER socket served on its own thread from construction until destruction.
class RendezvousServer {
 public:
  // endpoint: "tcp://127.0.0.1:*" picks a free port; see endpoint() for the bound one.
  // Binding happens here, so a taken port throws at once (RendezvousError).
  explicit RendezvousServer(std::string endpoint = "tcp://127.0.0.1:*",
                            RendezvousServerOptions options = {});
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  // The endpoint clients connect to, with the real port.
  const std::string& endpoint() const { return endpoint_; }

 private:
  void serve();

  RendezvousServerOptions options_;
  zmq::context_t context_;
  zmq::socket_t socket_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// DEALER client scoped to one job. Not thread-safe: one client per thread (Gloo only uses
// the store from the thread that calls connectFullMesh).
class RendezvousClient : public gloo::rendezvous::Store {
 public:
  // timeout: default for get/wait and for every server round trip. Connecting never
  // blocks; the first request waits for the server up to the timeout.
  RendezvousClient(std::string endpoint, std::string job,
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

 private:
  // One round trip; returns the reply payload. `wait_ms` is how long the server may park
  // the request (0 for requests that never wait).
  std::string call(const std::string& op, std::vector<std::string> args,
                   std::chrono::milliseconds wait_ms, const std::string& what);

  std::string endpoint_;
  std::string job_;
  std::chrono::milliseconds timeout_;
  uint64_t next_id_ = 1;
  zmq::context_t context_;
  zmq::socket_t socket_;
};

// Rank for a process that was not told its own: the n-th process to call this for the job
// gets n-1 (0..world_size-1, each exactly once). Throws when more than world_size
// processes ask, naming the job. counter_key lets one job hold several rank groups.
int assign_rank(RendezvousClient& client, int world_size,
                const std::string& counter_key = "dsactor/rank_counter");

// Root publishes `blob` under key; every other rank waits for it (up to the client's
// timeout) and gets it back. Returns the blob on every rank. Used for the NCCL unique id.
std::vector<char> broadcast_blob(RendezvousClient& client, const std::string& key, int rank,
                                 int root, const std::vector<char>& blob = {});

}  // namespace dsactor::actors
