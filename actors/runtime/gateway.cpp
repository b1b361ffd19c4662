#include "actors/runtime/gateway.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "actors/runtime/thread_name.h"
#include "messages/request_channel.h"
#include "security/zap_handler.h"

namespace dsactor::actors {

namespace msg = dsactor::messages;

// Received messages ZeroMQ keeps per connection before it stops reading that connection.
constexpr int kReceiveQueue = 8;

ReplySink::ReplySink() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
}

ReplySink::~ReplySink() {
  ::close(fd_);
}

void ReplySink::push(std::vector<zmq::message_t> frames) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(frames));
  }
  wake();
}

void ReplySink::wake() {
  const uint64_t one = 1;
  // EAGAIN means the counter is already non-zero: the gateway wakes anyway.
  [[maybe_unused]] auto n = ::write(fd_, &one, sizeof one);
}

std::deque<std::vector<zmq::message_t>> ReplySink::drain() {
  uint64_t count;
  [[maybe_unused]] auto n = ::read(fd_, &count, sizeof count);
  std::lock_guard lock(mutex_);
  return std::exchange(queue_, {});
}

Request::~Request() {
  if (ledger) ledger->release(peer, bytes);
}

bool InflightLedger::admit(const std::string& peer, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  Count& c = per_peer_[peer];
  const bool over = c.requests >= limits_.requests_per_client ||
                    (c.bytes > 0 && c.bytes + bytes > limits_.bytes_per_client) ||
                    (bytes_ > 0 && bytes_ + bytes > limits_.bytes);
  if (over) {
    if (c.requests == 0) per_peer_.erase(peer);
    return false;
  }
  c.requests++;
  c.bytes += bytes;
  bytes_ += bytes;
  return true;
}

void InflightLedger::release(const std::string& peer, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  auto c = per_peer_.find(peer);
  if (c == per_peer_.end()) return;
  c->second.bytes -= std::min(c->second.bytes, bytes);
  bytes_ -= std::min(bytes_, bytes);
  if (--c->second.requests == 0) per_peer_.erase(c);
}

uint64_t InflightLedger::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

void Request::reply(std::vector<zmq::message_t> body) const {
  if (channel) {
    if (body.size() != 1) {
      const auto& h = message.header;
      body = msg::encode(msg::Header{
          h.request_id, h.job_id,
          msg::ErrorReply{msg::ErrorCode::internal,
                          "the reply has a payload frame, which a request channel cannot carry"}});
    }
    const auto& f = body.front();
    // Never waits: a trainer that stops reading its answers loses them, not the service
    // its worker.
    const bool sent = msg::send_datagram(
        channel->get(), {static_cast<const std::byte*>(f.data()), f.size()}, false);
    if (counters) (sent ? counters->replies : counters->dropped)++;
    return;
  }
  std::span<const zmq::message_t> routing(frames.data(), routing_frames);
  sink->push(msg::with_envelope(routing, std::move(body)));
}

struct Gateway::Shared {
  std::unique_ptr<security::ZapHandler> zap;  // with keys; outlives the router
  zmq::socket_t router;
  std::shared_ptr<ReplySink> sink = std::make_shared<ReplySink>();
  std::shared_ptr<InflightLedger> ledger;
  std::atomic<bool> stop{false};
  GatewayOptions options;
  request_handler handler;
  std::shared_ptr<GatewayCounters> counters;

  void send(std::vector<zmq::message_t>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      // A ROUTER drops what it cannot route (peer gone); nothing to do about it here.
      if (!router.send(frames[i], flags)) break;
    }
    counters->replies++;
  }

  void flush_replies() {
    for (auto& frames : sink->drain()) send(frames);
  }

  // Receives one whole multipart message, keeping at most max_frames (+1 to tell that
  // there were more) so a hostile sender cannot make us hold an unbounded frame list.
  bool receive(std::vector<zmq::message_t>& frames) {
    frames.clear();
    bool more = true;
    while (more) {
      zmq::message_t part;
      if (!router.recv(part, frames.empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none)) {
        return false;
      }
      more = part.more();
      if (frames.size() <= options.max_frames) frames.push_back(std::move(part));
    }
    return true;
  }

  void on_message(std::vector<zmq::message_t> frames) {
    // Its queue is ZeroMQ's (read in batches), not a mailbox: no depth to report.
    const metrics::ActorFigures::Handling handling(options.figures, 0);
    auto req = std::make_shared<Request>();
    req->frames = std::move(frames);
    req->sink = sink;
    auto env = msg::split_envelope(req->frames);
    if (!env) {
      counters->dropped++;
      spdlog::warn("gateway: dropped a message without routing envelope ({} frames)",
                   req->frames.size());
      return;
    }
    req->routing_frames = env->routing.size();
    auto answer = [&](const msg::DecodeError& e) {
      counters->refused++;
      spdlog::debug("gateway: refused a request: {}: {}", msg::to_string(e.code), e.message);
      if (options.figures)
        options.figures->error(
            fmt::format("refused a request: {}: {}", msg::to_string(e.code), e.message));
      auto reply = msg::with_envelope(env->routing, msg::encode(msg::error_reply(0, "", e)));
      send(reply);
    };
    if (req->frames.size() > options.max_frames) {
      answer({msg::DecodeErrc::wrongFrameCount,
              "more than " + std::to_string(options.max_frames) + " frames"});
      return;
    }
    auto decoded = msg::decode(env->body, options.limits);
    if (!decoded) {
      answer(decoded.error());
      return;
    }
    req->message = std::move(decoded.value());
    // The key ZAP admitted the sender under, from any of its frames.
    req->peer = security::peer_key(req->frames.back());
    if (options.answer_inline) {
      const auto& h = req->message.header;
      if (auto body = options.answer_inline(h, req->peer)) {
        counters->requests++;
        auto reply = msg::with_envelope(
            env->routing, msg::encode(msg::Header{h.request_id, h.job_id, std::move(*body)}));
        send(reply);
        return;
      }
    }
    uint64_t bytes = 0;
    for (const auto& f : req->frames) bytes += f.size();
    if (!ledger->admit(req->peer, bytes)) {
      counters->busy++;
      counters->refused++;
      if (options.figures)
        options.figures->error("busy: too many requests in flight from a client");
      const auto& h = req->message.header;
      auto reply = msg::with_envelope(
          env->routing,
          msg::encode(msg::Header{h.request_id, h.job_id,
                                  msg::ErrorReply{msg::ErrorCode::busy,
                                                  "too many requests in flight from this "
                                                  "client; retry after a pause"}}));
      send(reply);
      return;
    }
    req->ledger = ledger;
    req->bytes = bytes;
    counters->requests++;
    counters->traffic.count(req->message);
    caf::anon_send(handler, handle_atom::value, RequestPtr(std::move(req)));
  }

  // Answers a request read from channel `c` that the gateway refuses, on the channel.
  void refuse_on_channel(const RequestChannels::Channel& c, uint64_t request_id,
                         const std::string& job, msg::ErrorCode code, const std::string& why) {
    counters->refused++;
    spdlog::debug("gateway: refused a request on a channel: {}", why);
    if (options.figures) options.figures->error("refused a request on a channel: " + why);
    auto reply = msg::encode(msg::Header{request_id, job, msg::ErrorReply{code, why}});
    const auto& f = reply.front();
    if (msg::send_datagram(c.fd->get(), {static_cast<const std::byte*>(f.data()), f.size()}, false))
      counters->replies++;
    else
      counters->dropped++;
  }

  void on_channel_message(const RequestChannels::Channel& c, std::span<const std::byte> bytes) {
    const metrics::ActorFigures::Handling handling(options.figures, 0);
    auto req = std::make_shared<Request>();
    req->frames.emplace_back(bytes.data(), bytes.size());
    req->routing_frames = 0;
    auto decoded = msg::decode(req->frames, options.limits);
    if (!decoded) {
      const auto& e = decoded.error();
      refuse_on_channel(c, 0, "", msg::reply_code(e.code),
                        std::string(msg::to_string(e.code)) + ": " + e.message);
      return;
    }
    req->message = std::move(decoded.value());
    const auto& h = req->message.header;
    // What the channel is for, and nothing else: a same-host push of its arena's job. Any
    // other request goes over the ROUTER, where its key is checked as it arrives.
    const auto* push = std::get_if<msg::PushGradients>(&h.body);
    if (!push || !push->arena || h.job_id != c.job) {
      refuse_on_channel(c, h.request_id, h.job_id, msg::ErrorCode::malformed,
                        "a request channel carries arena pushes of job '" + c.job + "' only; got " +
                            std::string(msg::kind_name(h.body)) +
                            (push && push->arena ? " of job '" + h.job_id + "'" : ""));
      return;
    }
    req->peer = c.peer;
    const uint64_t bytes_in = bytes.size();
    if (!ledger->admit(req->peer, bytes_in)) {
      counters->busy++;
      if (options.figures)
        options.figures->error("busy: too many requests in flight from a client");
      refuse_on_channel(c, h.request_id, h.job_id, msg::ErrorCode::busy,
                        "too many requests in flight from this client; retry after a pause");
      return;
    }
    req->ledger = ledger;
    req->bytes = bytes_in;
    req->channel = c.fd;
    req->counters = counters;
    counters->requests++;
    counters->channel_requests++;
    counters->traffic.count(req->message);
    caf::anon_send(handler, handle_atom::value, RequestPtr(std::move(req)));
  }

  // Reads a bounded batch of channel `c`'s datagrams; false once its trainer closed it.
  bool read_channel(const RequestChannels::Channel& c, std::vector<std::byte>& datagram) {
    const size_t max = std::min(options.limits.max_header_bytes, msg::kMaxChannelRequestBytes);
    for (int i = 0; i < 64; ++i) {
      switch (msg::receive_datagram(c.fd->get(), datagram, max)) {
        case msg::Datagram::message:
          on_channel_message(c, datagram);
          break;
        case msg::Datagram::truncated:
          refuse_on_channel(c, 0, "", msg::ErrorCode::malformed,
                            "a request on a channel is one header frame of at most " +
                                std::to_string(max) + " bytes");
          break;
        case msg::Datagram::none:
          return true;
        case msg::Datagram::closed:
          return false;
      }
    }
    return true;
  }

  void loop() {
    name_this_thread("gateway");
    std::vector<zmq::pollitem_t> items;
    std::vector<RequestChannels::Channel> channels;
    // The ROUTER, the replies' eventfd, then (with channels) the list's eventfd and each
    // channel, rebuilt whenever the list changes.
    const size_t first_channel = options.channels ? 3 : 2;
    auto rebuild = [&] {
      items = {{router.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, sink->fd(), ZMQ_POLLIN, 0}};
      if (!options.channels) return;
      channels = options.channels->current();
      items.push_back({nullptr, options.channels->changed_fd(), ZMQ_POLLIN, 0});
      for (const auto& c : channels) items.push_back({nullptr, c.fd->get(), ZMQ_POLLIN, 0});
    };
    rebuild();
    std::vector<zmq::message_t> frames;
    std::vector<std::byte> datagram;
    while (!stop.load()) {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(500));
      if (items[1].revents & ZMQ_POLLIN) flush_replies();
      if (items[0].revents & ZMQ_POLLIN) {
        // A bounded batch, so replies keep flowing under a flood of requests.
        for (int i = 0; i < 64 && receive(frames); ++i) on_message(std::move(frames));
      }
      bool changed = options.channels && (items[2].revents & ZMQ_POLLIN);
      for (size_t i = first_channel; i < items.size(); ++i) {
        if (!(items[i].revents & (ZMQ_POLLIN | ZMQ_POLLERR))) continue;
        const auto& c = channels[i - first_channel];
        if (!read_channel(c, datagram)) {
          spdlog::debug("gateway: a trainer closed its request channel (job '{}')", c.job);
          options.channels->detach(c.id);
          changed = true;
        }
      }
      if (changed) rebuild();
    }
    flush_replies();
    router.close();
    zap.reset();
  }
};

Gateway::Gateway(caf::actor_system& system, zmq::context_t& context, GatewayOptions options,
                 request_handler handler)
    : shared_(std::make_shared<Shared>()), counters_(std::make_shared<GatewayCounters>()) {
  auto& s = *shared_;
  s.options = std::move(options);
  s.handler = std::move(handler);
  s.counters = counters_;
  s.ledger = std::make_shared<InflightLedger>(s.options.inflight);
  // Before the socket exists: ZeroMQ asks the handler at each handshake from then on.
  if (!s.options.security.insecure)
    s.zap = std::make_unique<security::ZapHandler>(context, s.options.security.authorized,
                                                   s.options.name);
  s.router = zmq::socket_t(context, zmq::socket_type::router);
  const auto& lim = s.options.limits;
  s.router.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(std::max<uint64_t>(
                                             lim.max_payload_bytes, lim.max_header_bytes)));
  s.router.set(zmq::sockopt::linger, 1000);
  // Finite queues. Inbound, a full pipe stops reading that connection (nothing is lost)
  // and the gateway drains pipes as fast as it decodes, so a few messages per connection
  // are enough: ZeroMQ then holds at most kReceiveQueue messages of each connection.
  // Outbound, a ROUTER at its mark drops, so the mark sits well above what a client may
  // have in flight: only a client that floods past `busy` and never reads its answers
  // loses some.
  const auto per_client =
      static_cast<int>(std::min<uint64_t>(s.options.inflight.requests_per_client, 1 << 20));
  s.router.set(zmq::sockopt::rcvhwm, kReceiveQueue);
  s.router.set(zmq::sockopt::sndhwm, 4 * per_client + 64);
  security::secure_server_socket(s.router, s.options.security);
  try {
    s.router.bind(s.options.listen);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error("gateway: cannot listen on " + s.options.listen + ": " + e.what());
  }
  endpoint_ = s.router.get(zmq::sockopt::last_endpoint);
  auto promise = std::make_shared<std::promise<void>>();
  done_ = promise->get_future();
  // The socket moves to the detached actor's thread here; the spawn is the memory barrier
  // ZeroMQ asks for when a socket changes threads, and no other thread touches it after.
  // State travels as spawn arguments, not lambda captures: CAF 0.17 dereferences a null
  // argument tuple for argument-less spawns (init_fun_factory.hpp), which UBSan reports.
  system.spawn<caf::detached>(
      [](caf::blocking_actor*, std::shared_ptr<Shared> shared,
         std::shared_ptr<std::promise<void>> done) {
        try {
          shared->loop();
        } catch (const std::exception& e) {
          spdlog::error("gateway: stopped by an error: {}", e.what());
        }
        done->set_value();
      },
      shared_, promise);
}

Gateway::~Gateway() {
  stop();
}

void Gateway::stop() {
  if (!done_.valid()) return;
  shared_->stop = true;
  shared_->sink->wake();
  done_.wait();
  done_ = {};
}

}  // namespace dsactor::actors
