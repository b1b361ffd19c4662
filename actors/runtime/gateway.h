#pragma once

// The ZeroMQ gateway of a service: a ROUTER socket polled on its own detached actor that
// decodes each request (messages/codec.h: frame count, lengths, dtype, crc32c) and hands
// it to a request-handler actor; handlers reply through a ReplySink that the gateway's
// thread drains, so the socket is only ever touched by that one thread. Requests that do
// not decode are answered with an ErrorReply by the gateway itself (or dropped when they
// carry no routing envelope) and never reach a handler.
//
// Payloads never travel by copy: a Request owns the received zmq frames and is passed as a
// shared_ptr; a reply's payload frame is built zero-copy by the handler.
//
// Who may send: with keys (GatewayOptions::security), the ROUTER is a CurveZMQ server and
// the gateway runs the ZAP handler of its context, which admits only authorized client
// keys; each Request carries its sender's key (`peer`). How much a client may have in
// flight: requests received and not yet released (answered, and their frames freed) are
// counted per client key; past InflightLimits the gateway answers `busy` itself, so a flood
// costs the service at most those bytes.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <zmq.hpp>

#include "actors/runtime/job_traffic.h"
#include "actors/runtime/request_channels.h"
#include "messages/codec.h"
#include "metrics/actor_figures.h"
#include "security/transport_security.h"

namespace dsactor::actors {

class InflightLedger;
struct GatewayCounters;

// Thread-safe queue of outgoing multipart messages, with an eventfd the gateway's
// zmq_poll watches.
class ReplySink {
 public:
  ReplySink();
  ~ReplySink();
  ReplySink(const ReplySink&) = delete;
  ReplySink& operator=(const ReplySink&) = delete;

  void push(std::vector<zmq::message_t> frames);
  // Wakes the gateway without a message (stop).
  void wake();
  std::deque<std::vector<zmq::message_t>> drain();
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::mutex mutex_;
  std::deque<std::vector<zmq::message_t>> queue_;
};

// One decoded request. `message.payload` views `frames`, which are never moved again.
// Counted in flight for its sender until destroyed (answered, and no actor holds it).
struct Request {
  std::vector<zmq::message_t> frames;  // routing..., empty delimiter, header, payload?
  size_t routing_frames = 0;
  messages::Message message;
  std::shared_ptr<ReplySink> sink;
  // The sender's CurveZMQ public key (Z85) as the ZAP handler admitted it; "" without keys.
  std::string peer;
  std::shared_ptr<InflightLedger> ledger;
  uint64_t bytes = 0;  // of frames, as counted in flight
  // Read from a same-host request channel (GatewayOptions::channels): `frames` is its one
  // header frame, no envelope, and the reply goes back on the channel from the replying
  // thread (no gateway wake-up), counted in `counters`.
  std::shared_ptr<const messages::UniqueFd> channel;
  std::shared_ptr<GatewayCounters> counters;

  Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  // Sends `body` (a reply without envelope) back to the requester. Over a channel only a
  // body of one frame fits: another is answered with an ErrorReply saying so.
  void reply(std::vector<zmq::message_t> body) const;
};
using RequestPtr = std::shared_ptr<const Request>;

}  // namespace dsactor::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::actors::RequestPtr)

namespace dsactor::actors {

using handle_atom = caf::atom_constant<caf::atom("handle")>;
// What a role's request handler implements: one decoded request in, replies via
// Request::reply (possibly later, possibly several handlers deep).
using request_handler = caf::typed_actor<caf::reacts_to<handle_atom, RequestPtr>>;

// What one client key (and all clients together) may have in flight; past it a request is
// answered `busy` (retry after a pause). A request is admitted when its client has nothing
// else in flight whatever its size, so one message of any accepted size always gets through.
struct InflightLimits {
  uint64_t requests_per_client = 64;
  uint64_t bytes_per_client = uint64_t{1} << 30;
  uint64_t bytes = uint64_t{4} << 30;  // all clients
};

// Requests in flight per client key, shared by the gateway (which admits) and the Requests
// (which release on destruction, on whatever thread drops them last). Thread-safe.
class InflightLedger {
 public:
  explicit InflightLedger(InflightLimits limits) : limits_(limits) {}
  // Counts a request of `bytes` for `peer`, or returns false (busy) past the limits.
  bool admit(const std::string& peer, uint64_t bytes);
  void release(const std::string& peer, uint64_t bytes);
  uint64_t bytes() const;

 private:
  struct Count {
    uint64_t requests = 0, bytes = 0;
  };
  InflightLimits limits_;
  mutable std::mutex mutex_;
  std::map<std::string, Count> per_peer_;
  uint64_t bytes_ = 0;
};

struct GatewayOptions {
  // Where the ROUTER binds. "tcp://127.0.0.1:*" picks a free port (see endpoint()).
  std::string listen = "tcp://127.0.0.1:5555";
  // What decode() accepts; frames above max(max_payload_bytes, max_header_bytes) are
  // refused by ZeroMQ itself (ZMQ_MAXMSGSIZE), which drops the connection.
  messages::Limits limits;
  // CurveZMQ keys and the client keys admitted, or insecure (plain; the caller checked
  // that the endpoint allows it: security::check_listen_security).
  security::ServerSecurity security;
  // The service's name in the ZAP handler's log lines.
  std::string name = "gateway";
  InflightLimits inflight;
  // Frames kept per message; extra frames are received and discarded (the message is
  // then answered as wrongFrameCount). Default: 8 (identity, delimiter, header, payload).
  size_t max_frames = 8;
  // Requests the gateway answers on its own thread, never queued behind the handler's work
  // (heartbeats): given a decoded request and its sender's key, the reply's body, or
  // nullopt to hand it to the handler as usual. Called on the gateway's thread: it must
  // not block. Unset: every request goes to the handler.
  std::function<std::optional<messages::Body>(const messages::Header&, const std::string& peer)>
      answer_inline;
  // Where the gateway counts each message it handles and the text of each it refuses
  // (the process's ActorBoard, "gateway"); null: not counted.
  metrics::ActorFigures* figures = nullptr;
  // Same-host request channels the gateway reads beside the ROUTER (request_channels.h).
  // Each carries arena pushes (PushGradients with an arena slice) of its own job only, from
  // the client key its arena was mapped under; anything else read there is refused on it.
  // Null: none.
  std::shared_ptr<RequestChannels> channels;
};

struct GatewayCounters {
  std::atomic<uint64_t> requests{0};          // decoded and handed to the handler
  std::atomic<uint64_t> refused{0};           // answered with an ErrorReply by the gateway
  std::atomic<uint64_t> busy{0};              // of those, `busy` (past the in-flight limits)
  std::atomic<uint64_t> dropped{0};           // could not be answered
  std::atomic<uint64_t> replies{0};           // sent back
  std::atomic<uint64_t> channel_requests{0};  // of `requests`, read from request channels
  JobTraffic traffic;                         // per job, from the decoded requests
};

class Gateway {
 public:
  // Binds the ROUTER (throws std::runtime_error naming the endpoint on failure) and
  // starts polling it on a detached actor.
  Gateway(caf::actor_system& system, zmq::context_t& context, GatewayOptions options,
          request_handler handler);
  // stop().
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // The bound endpoint, with the real port when the listen address asked for "*".
  const std::string& endpoint() const { return endpoint_; }
  const GatewayCounters& counters() const { return *counters_; }
  // Stops polling, sends what is queued, closes the socket; idempotent.
  void stop();

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<GatewayCounters> counters_;
  std::string endpoint_;
  std::future<void> done_;
};

}  // namespace dsactor::actors
