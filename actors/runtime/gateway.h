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

#include <atomic>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <zmq.hpp>

#include "actors/runtime/job_traffic.h"
#include "messages/codec.h"

namespace dsactor::actors {

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
struct Request {
  std::vector<zmq::message_t> frames;  // routing..., empty delimiter, header, payload?
  size_t routing_frames = 0;
  messages::Message message;
  std::shared_ptr<ReplySink> sink;

  // Sends `body` (a reply without envelope) back to the requester.
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

struct GatewayOptions {
  // Where the ROUTER binds. "tcp://127.0.0.1:*" picks a free port (see endpoint()).
  std::string listen = "tcp://127.0.0.1:5555";
  // What decode() accepts; frames above max(max_payload_bytes, max_header_bytes) are
  // refused by ZeroMQ itself (ZMQ_MAXMSGSIZE), which drops the connection.
  messages::Limits limits;
  // Frames kept per message; extra frames are received and discarded (the message is
  // then answered as wrongFrameCount). Default: 8 (identity, delimiter, header, payload).
  size_t max_frames = 8;
};

struct GatewayCounters {
  std::atomic<uint64_t> requests{0};  // decoded and handed to the handler
  std::atomic<uint64_t> refused{0};   // answered with an ErrorReply by the gateway
  std::atomic<uint64_t> dropped{0};   // could not be answered
  std::atomic<uint64_t> replies{0};   // sent back
  JobTraffic traffic;                 // per job, from the decoded requests
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
