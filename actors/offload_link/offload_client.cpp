#include "actors/offload_link/offload_client.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <random>
#include <thread>

#include <zmq_addon.hpp>

#include "checksum/crc32c.h"
#include "checksum/crc32c_copy.h"
#include "messages/arena_handoff.h"
#include "messages/huge_pages.h"
#include "messages/request_channel.h"
#include "messages/shm_arena.h"

namespace dsactor::actors {

namespace msg = dsactor::messages;
using Clock = std::chrono::steady_clock;

namespace {

// The failure of a request no connection took: the handshake never completed.
ServiceFailure unsent_failure(const std::string& kind, const std::string& endpoint,
                              std::chrono::milliseconds timeout) {
  return ServiceFailure{
      ServiceFailure::Kind::timeout, msg::ErrorCode::internal,
      "could not send " + kind + " to the offload service at " + endpoint + " within " +
          std::to_string(timeout.count()) +
          " ms: no connection completed its handshake (is the service running, does it admit "
          "this client's key, and is the service key given the service's own?)"};
}

// True when a heartbeat's Pong shows the operation in flight moved on since `last` (another
// operation, or this one further on); the gateway answering is a sign of life only.
bool pong_advanced(msg::Pong& last, const msg::Pong& pong) {
  const bool moved =
      pong.operation != last.operation || pong.step != last.step || pong.done != last.done;
  last = pong;
  return moved;
}

}  // namespace

OffloadError::OffloadError(msg::ErrorCode code, const std::string& message)
    : std::runtime_error(std::string(msg::to_string(code)) + ": " + message), code_(code) {}

OffloadClient::OffloadClient(std::string endpoint, const security::ClientSecurity& security,
                             std::chrono::milliseconds timeout, std::string job_id)
    : endpoint_(std::move(endpoint)),
      timeout_(timeout),
      job_id_(std::move(job_id)),
      security_(security),
      context_(1),
      socket_(context_, zmq::socket_type::dealer) {
  // Nothing may wait in ~OffloadClient for an unreachable service.
  socket_.set(zmq::sockopt::linger, 0);
  // Unbounded: what this client has outstanding is bounded by its caller (the trainer's
  // buckets), and a DEALER at its mark would block the caller's send.
  socket_.set(zmq::sockopt::sndhwm, 0);
  socket_.set(zmq::sockopt::rcvhwm, 0);
  // A DEALER holds a message only for a connection: when the handshake fails (this key is
  // not admitted, or the service's key is not the one given) it has none, and a send would
  // wait forever.
  socket_.set(zmq::sockopt::sndtimeo, static_cast<int>(timeout_.count()));
  security::secure_client_socket(socket_, security);
  socket_.connect(endpoint_);
}

OffloadClient::~OffloadClient() {
  unmap_arena();
}

// ---- arena ----------------------------------------------------------------------------

ServiceResult<bool> OffloadClient::try_map_arena(size_t slot_bytes, size_t slots, SlotKeep keep) {
  if (has_arena() || slot_bytes == 0 || slots == 0 || !messages::is_local_endpoint(endpoint_))
    return false;
  // Slots page-aligned, so half and float views of them are aligned too.
  const size_t page = 4096;
  const size_t slot = (slot_bytes + page - 1) / page * page;
  auto fallback = [&](const std::string& why) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      spdlog::warn("offload client: no shared-memory arena with {} ({}); payloads go as frames",
                   endpoint_, why);
    } else {
      spdlog::debug("offload client: no shared-memory arena with {} ({})", endpoint_, why);
    }
    return false;
  };
  std::unique_ptr<messages::SharedArena> arena;
  try {
    arena = std::make_unique<messages::SharedArena>(slot * slots);
  } catch (const std::exception& e) {
    return fallback(e.what());
  }
  // Three steps: a ticket (authenticated, so the arena is bound to this key and job), the
  // fd over the service's Unix socket with the ticket, then the mapping under the ticket.
  ServiceResult<Reply> reply = await(send(msg::MapArena{{}, arena->size(), {}}));
  if (!reply.ok()) return std::move(reply.error());
  const msg::Body* body = &reply->header.body;
  if (const auto* e = std::get_if<msg::ErrorReply>(body))
    return fallback(std::string(msg::to_string(e->code)) + ": " + e->message);
  const auto* ticket = std::get_if<msg::MapArenaReply>(body);
  if (!ticket || ticket->ticket.empty() || ticket->socket.empty())
    return fallback("no ticket in the reply " + std::string(msg::kind_name(*body)));
  // The request channel goes with the arena: the same door, the same ticket and checks.
  std::pair<msg::UniqueFd, msg::UniqueFd> channel;
  try {
    if (request_channel_on_) channel = msg::request_channel_pair();
    msg::hand_over_fd(ticket->socket, ticket->ticket, arena->fd(), timeout_,
                      channel.second ? channel.second.get() : -1);
  } catch (const std::exception& e) {
    return fallback(e.what());
  }
  channel.second = {};  // the service holds its own copy now
  reply = await(send(msg::MapArena{{}, arena->size(), ticket->ticket}));
  if (!reply.ok()) return std::move(reply.error());
  body = &reply->header.body;
  if (const auto* e = std::get_if<msg::ErrorReply>(body))
    return fallback(std::string(msg::to_string(e->code)) + ": " + e->message);
  const auto* ok = std::get_if<msg::MapArenaReply>(body);
  if (!ok || ok->arena_id == 0 || ok->size != arena->size())
    return fallback("unexpected reply " + std::string(msg::kind_name(*body)));
  spdlog::debug("offload client: {} maps our {}-byte arena as {}", endpoint_, arena->size(),
                ok->arena_id);
  arena_id_ = ok->arena_id;
  pool_ = std::make_shared<SlotPool>(std::move(arena), ok->arena_id, slot, slots, keep);
  if (ok->channel) channel_ = std::move(channel.first);
  return true;
}

size_t OffloadClient::arena_bytes() const {
  return arena_id_ != 0 ? pool_->arena_bytes() : 0;
}

void OffloadClient::share_arena(OffloadClient& owner) {
  if (&owner == this || pool_ || owner.endpoint() != endpoint_ || !owner.has_arena())
    throw std::logic_error("share_arena: " + endpoint_ + " can only use the mapped arena of " +
                           "another client of the same service, and has none of its own");
  pool_ = owner.pool_;
}

void OffloadClient::unmap_arena() {
  if (arena_id_ == 0) return;
  // Best effort: a service that is gone unmaps everything when it stops anyway. The
  // linger lets the request leave before the socket closes, without waiting for a reply.
  // The channel first: nothing waits here for its answers (the arena and its slots go).
  channel_ = {};
  on_channel_.clear();
  try {
    send(msg::UnmapArena{arena_id_});
    socket_.set(zmq::sockopt::linger, 200);
  } catch (const std::exception&) {
  }
  arena_id_ = 0;
}

ArenaBuffer OffloadClient::arena_buffer(size_t bytes) {
  return pool_ ? pool_->take(bytes, bytes) : ArenaBuffer{};
}

size_t OffloadClient::trim_free_slots() {
  return arena_id_ != 0 ? pool_->trim_free() : 0;
}

size_t OffloadClient::resident_slot_bytes() const {
  return arena_id_ != 0 ? pool_->resident_bytes() : 0;
}

uint64_t OffloadClient::faulted_slot_bytes() const {
  return arena_id_ != 0 ? pool_->faulted_bytes() : 0;
}

size_t OffloadClient::peak_idle_slot_bytes() const {
  return arena_id_ != 0 ? pool_->peak_idle_bytes() : 0;
}

size_t OffloadClient::slot_keep_limit_bytes() const {
  return arena_id_ != 0 ? pool_->keep_limit_bytes() : 0;
}

void OffloadClient::forget(uint64_t id) {
  outstanding_.erase(id);
  if (auto l = leases_.find(id); l != leases_.end()) {
    stale_.insert_or_assign(id, std::move(l->second));
    leases_.erase(l);
  }
}

bool OffloadClient::transmit(const Pending& p) {
  std::vector<zmq::message_t> frames = msg::has_payload(p.header.body)
                                           ? msg::encode(p.header, p.payload, p.owner)
                                           : msg::encode(p.header);
  if (p.on_channel && channel_ && frames.size() == 1) {
    const std::span<const std::byte> bytes(static_cast<const std::byte*>(frames[0].data()),
                                           frames[0].size());
    // The service's gateway reads its channels as fast as it decodes; a full queue means
    // it is gone or stuck, and a wait bounded like a ZeroMQ send's tells which.
    bool sent = msg::send_datagram(channel_.get(), bytes, false);
    if (!sent && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd out{channel_.get(), POLLOUT, 0};
      sent = ::poll(&out, 1, static_cast<int>(timeout_.count())) == 1 &&
             msg::send_datagram(channel_.get(), bytes, false);
    }
    if (sent) channel_requests_sent_.fetch_add(1, std::memory_order_relaxed);
    return sent;
  }
  return zmq::send_multipart(socket_, msg::with_envelope({}, std::move(frames))).has_value();
}

bool OffloadClient::channel_reply(std::vector<zmq::message_t>& frames) {
  if (!channel_) return false;
  switch (msg::receive_datagram(channel_.get(), datagram_, msg::kMaxChannelRequestBytes)) {
    case msg::Datagram::message:
      frames.clear();
      frames.emplace_back(datagram_.data(), datagram_.size());
      return true;
    case msg::Datagram::closed:
      spdlog::warn("offload client: the service at {} closed the request channel", endpoint_);
      channel_ = {};
      return false;
    case msg::Datagram::truncated:  // no reply is that long: not the service's
    case msg::Datagram::none:
      return false;
  }
  return false;
}

uint64_t OffloadClient::send(msg::Body body, std::span<const std::byte> payload,
                             std::shared_ptr<const void> owner) {
  const uint64_t id = next_id_++;
  requests_sent_.fetch_add(1, std::memory_order_relaxed);
  if (auto* push = std::get_if<msg::PushGradients>(&body);
      push && update_lr_ && push->micro_step == 0) {
    push->update_at_push = true;
    push->update_lr = *update_lr_;
  }
  Pending p;
  p.header = msg::Header{id, job_id_, std::move(body)};
  p.kind = std::string(msg::kind_name(p.header.body));
  if (msg::has_payload(p.header.body)) {
    if (!owner) {
      // Borrowed bytes: copied once into a buffer this request owns, which a send after
      // `busy` reuses.
      auto copy = std::make_shared<std::vector<std::byte>>(payload.begin(), payload.end());
      payload = *copy;
      owner = std::move(copy);
    }
    p.payload = payload;
    p.owner = std::move(owner);
  }
  const auto* push = std::get_if<msg::PushGradients>(&p.header.body);
  p.on_channel = channel_ && push && push->arena && !socket_requests_unanswered();
  if (!p.on_channel) await_channel_replies();
  p.sent = transmit(p);
  if (p.on_channel && p.sent) on_channel_.insert(id);
  outstanding_.emplace(id, std::move(p));
  return id;
}

bool OffloadClient::socket_requests_unanswered() const {
  return std::any_of(outstanding_.begin(), outstanding_.end(),
                     [](const auto& o) { return o.second.sent && !o.second.on_channel; });
}

void OffloadClient::await_channel_replies() {
  const auto until = Clock::now() + timeout_;
  while (!on_channel_.empty() && channel_) {
    const auto now = Clock::now();
    if (now >= until) {
      // The service is gone or stuck: what is sent next will tell, as it would have alone.
      spdlog::warn("offload client: {} request(s) on the channel to {} unanswered after {} ms",
                   on_channel_.size(), endpoint_, timeout_.count());
      on_channel_.clear();
      return;
    }
    poll_sockets(std::chrono::duration_cast<std::chrono::milliseconds>(until - now));
    // Each reply is kept for its own await (or skipped, when its request was abandoned).
    while (take_reply(std::nullopt).message) {
    }
  }
  if (!channel_) on_channel_.clear();
}

bool OffloadClient::retry_busy(uint64_t id) {
  Pending& p = outstanding_.at(id);
  const auto now = Clock::now();
  if (p.busy++ == 0) p.first_busy = now;
  if (now - p.first_busy >= timeout_) return false;
  // 1, 2, 4 ... 200 ms, each with up to half again at random, so clients that were turned
  // away together do not come back together.
  static thread_local std::minstd_rand jitter(std::random_device{}());
  const auto base = std::chrono::milliseconds(std::min(200, 1 << std::min(p.busy - 1, 8)));
  std::this_thread::sleep_for(base +
                              std::chrono::microseconds(jitter() % (base.count() * 500 + 1)));
  return transmit(p);
}

uint64_t OffloadClient::send_set_parameters(uint64_t partition_id, uint64_t version,
                                            msg::DType dtype, std::span<const std::byte> values,
                                            std::shared_ptr<const void> owner) {
  const uint64_t n = values.size() / msg::dtype_size(dtype);
  return send(msg::SetParameters{partition_id, version, dtype, n}, values, std::move(owner));
}

uint64_t OffloadClient::send_push_gradients(uint64_t partition_id, uint64_t step,
                                            uint32_t micro_step, msg::DType dtype,
                                            std::span<const std::byte> grads,
                                            std::shared_ptr<const void> owner) {
  const uint64_t n = grads.size() / msg::dtype_size(dtype);
  return send(msg::PushGradients{partition_id, step, micro_step, dtype, n, {}}, grads,
              std::move(owner));
}

uint64_t OffloadClient::send_push_gradients(uint64_t partition_id, uint64_t step,
                                            uint32_t micro_step, msg::DType dtype, uint64_t count,
                                            ArenaBuffer grads, bool keep_until_commit,
                                            std::optional<msg::PushedStats> given_stats) {
  const uint64_t bytes = count * msg::dtype_size(dtype);
  if (!grads || grads.pool_ != pool_.get() || bytes > grads.bytes().size())
    throw std::invalid_argument("send_push_gradients: " + std::to_string(bytes) +
                                " bytes do not fit the arena buffer given");
  msg::PushGradients push{partition_id, step, micro_step, dtype, count, {}};
  push.arena = msg::ArenaSlice{pool_->arena_id(), grads.offset(), bytes, 0, false};
  push.keep_until_commit = keep_until_commit;
  push.given_stats = given_stats;
  if (grads.copied_ && grads.copied_->first == bytes) {
    // Known from the copy into the slot (the caller copied exactly these bytes in): the
    // service checks it whatever the setting, since it cost nothing here.
    push.arena->crc32c = grads.copied_->second;
  } else if (arena_checksums_) {
    push.arena->crc32c = checksum::crc32c(grads.bytes().data(), bytes);
  } else {
    push.arena->crc_omitted = true;  // written in place: the lease keeps it as written
  }
  const uint64_t id = send(push);
  leases_.emplace(id, Lease{std::move(grads), nullptr});
  return id;
}

uint64_t OffloadClient::send_fetch(uint64_t partition_id, uint64_t min_version, msg::DType dtype,
                                   size_t expected_bytes) {
  return send_fetch_request(
      msg::FetchParameters{partition_id, min_version, dtype, {}, fetch_part_bytes_},
      fetch_slot(expected_bytes));
}

ArenaBuffer OffloadClient::fetch_slot(size_t expected_bytes) {
  if (!pool_ || expected_bytes > pool_->slot_bytes()) return {};  // a frame
  // The slot is chosen for the size expected, and counted as written whole until the
  // answer says what the service wrote (await_fetch): a late reply's slot may hold anything.
  const size_t slot_bytes = pool_->slot_bytes();
  return pool_->take(expected_bytes > 0 ? expected_bytes : slot_bytes, slot_bytes);
}

uint64_t OffloadClient::send_fetch_request(msg::FetchParameters request, ArenaBuffer slot) {
  if (!slot) return send(request);
  request.arena =
      msg::ArenaSlice{pool_->arena_id(), slot.offset(), slot.bytes().size(), 0, !arena_checksums_};
  if (master_views_ && request.dtype == msg::DType::fp32 && !request.ranged()) {
    request.accept_master_view = true;
    if (auto v = views_.find(request.partition_id); v != views_.end())
      request.held_view = v->second.view_id;
  }
  const uint64_t id = send(request);
  leases_.emplace(id, Lease{std::move(slot), nullptr});
  return id;
}

void OffloadClient::abandon(uint64_t request_id) {
  // A reply that already arrived means the service is done with the slot.
  if (arrived_.erase(request_id) > 0) {
    leases_.erase(request_id);
    outstanding_.erase(request_id);
    return;
  }
  forget(request_id);
}

ServiceFailure OffloadClient::failure(const std::string& message) const {
  return ServiceFailure{ServiceFailure::Kind::failed, msg::ErrorCode::internal,
                        "offload service at " + endpoint_ + " " + message};
}

ServiceResult<OffloadClient::Reply> OffloadClient::await(uint64_t id) {
  auto take = [&](Reply r) {
    if (auto l = leases_.find(id); l != leases_.end()) {
      r.arena = std::move(l->second.own);
      leases_.erase(l);
    }
    return r;
  };
  if (auto it = arrived_.find(id); it != arrived_.end()) {
    Reply r = std::move(it->second);
    arrived_.erase(it);
    return take(std::move(r));
  }
  const auto waiting = outstanding_.find(id);
  if (waiting == outstanding_.end())
    throw std::logic_error("offload client for " + endpoint_ + ": request " + std::to_string(id) +
                           " is not outstanding");
  if (!waiting->second.sent) {
    const std::string kind = waiting->second.kind;
    forget(id);
    return unsent_failure(kind, endpoint_, timeout_);
  }
  // The timeout runs from the last sign of progress; with heartbeats, a service that sends
  // nothing at all for kMissedHeartbeats intervals is dead sooner than that.
  const auto started = Clock::now();
  auto progress_at = started, heard_at = started, pinged_at = started;
  last_pong_ = {};
  for (;;) {
    const auto now = Clock::now();
    const bool beats = heartbeat_.count() > 0;
    const auto dead_at = heard_at + kMissedHeartbeats * heartbeat_;
    if (beats && now >= dead_at) {
      const std::string kind = waiting->second.kind;
      forget(id);
      return silence(id, kind,
                     std::chrono::duration_cast<std::chrono::milliseconds>(now - heard_at), true);
    }
    if (now >= progress_at + timeout_) {
      const std::string kind = waiting->second.kind;
      forget(id);  // a reply that still comes is discarded
      return silence(id, kind,
                     std::chrono::duration_cast<std::chrono::milliseconds>(now - progress_at),
                     false);
    }
    if (beats && now >= pinged_at + heartbeat_) {
      send_ping();
      pinged_at = now;
    }
    auto wake = progress_at + timeout_;
    if (beats) wake = std::min({wake, dead_at, pinged_at + heartbeat_});
    const auto left = std::max(std::chrono::milliseconds(1),
                               std::chrono::duration_cast<std::chrono::milliseconds>(wake - now));
    const Heard heard = poll_sockets(left);
    if (heard.beat) heard_at = Clock::now();
    if (heard.advanced) progress_at = heard_at;
    if (!heard.reply) continue;
    Taken got = take_reply(id);
    if (got.heard) heard_at = Clock::now();
    if (!got.answer) continue;
    if (!got.answer->ok()) return std::move(*got.answer);
    return take(std::move(got.answer->value()));
  }
}

OffloadClient::Taken OffloadClient::take_reply(std::optional<uint64_t> waiting) {
  Taken got;
  std::vector<zmq::message_t> frames;
  // A reply on the request channel is its one frame, with no envelope.
  size_t routing = 0;
  if (channel_reply(frames)) {
    got.message = true;
  } else {
    if (!zmq::recv_multipart(socket_, std::back_inserter(frames), zmq::recv_flags::dontwait))
      return got;
    got.message = true;
    auto env = msg::split_envelope(frames);
    if (!env) return got;
    routing = frames.size() - env->body.size();
  }
  const std::span<const zmq::message_t> body(frames.data() + routing, frames.size() - routing);
  auto decoded = msg::decode(body);
  if (!decoded) {
    if (waiting) {
      forget(*waiting);
      got.answer = failure("sent an undecodable reply: " + decoded.error().message);
    }
    return got;
  }
  const uint64_t rid = decoded->header.request_id;
  on_channel_.erase(rid);
  got.heard = true;
  // The gateway's answer to a request it could not read (id 0) is taken as this one's,
  // the request being waited for.
  const bool mine =
      waiting && (rid == *waiting ||
                  (rid == 0 && std::holds_alternative<msg::ErrorReply>(decoded->header.body)));
  const bool other = !mine && outstanding_.count(rid) > 0;
  if (!mine && !other) {  // a late reply to a request that timed out: skip it
    stale_.erase(rid);    // the service is done with its slot
    return got;
  }
  if (const auto* e = std::get_if<msg::ErrorReply>(&decoded->header.body);
      e && e->code == msg::ErrorCode::busy && rid != 0 && retry_busy(rid)) {
    return got;  // sent again; its answer is still to come
  }
  Reply r{std::move(decoded->header), {}, {}, {}};
  if (msg::has_payload(r.header.body) && body.size() == 2) {
    // The decoded payload views the last frame; keep the frame itself.
    r.payload = std::move(frames.back());
  } else if (msg::has_payload(r.header.body) && body.size() > 2) {
    // The body's frames end the message: header, then each part.
    const size_t parts = body.size() - 1;
    for (size_t i = frames.size() - parts; i < frames.size(); ++i)
      r.payload_parts.push_back(std::move(frames[i]));
  }
  if (other) {  // a pipelined request's reply: its own await() takes it
    outstanding_.erase(rid);
    arrived_.emplace(rid, std::move(r));
    return got;
  }
  outstanding_.erase(*waiting);
  got.answer = ServiceResult<Reply>(std::move(r));
  return got;
}

bool OffloadClient::arrived(uint64_t id) {
  if (arrived_.count(id)) return true;
  if (!outstanding_.count(id))
    throw std::logic_error("offload client for " + endpoint_ + ": request " + std::to_string(id) +
                           " is not outstanding");
  while (take_reply(std::nullopt).message) {
  }
  return arrived_.count(id) > 0;
}

void OffloadClient::send_ping() {
  const uint64_t id = next_id_++;
  // Unanswered Pings of earlier waits are forgotten: their Pongs, if they come, are skipped.
  if (pings_.size() > 64) pings_.clear();
  // Never blocks: with no connection to take it (the service is gone), the Ping is simply
  // not sent, and the silence counts.
  auto frames = msg::with_envelope({}, msg::encode(msg::Header{id, job_id_, msg::Ping{id}}));
  if (zmq::send_multipart(beat_socket(), std::move(frames), zmq::send_flags::dontwait))
    pings_.insert(id);
}

zmq::socket_t& OffloadClient::beat_socket() {
  if (!beat_socket_) {
    beat_context_.emplace(1);
    zmq::socket_t s(*beat_context_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    security::secure_client_socket(s, security_);
    s.connect(endpoint_);
    beat_socket_.emplace(std::move(s));
  }
  return *beat_socket_;
}

OffloadClient::Heard OffloadClient::poll_sockets(std::chrono::milliseconds left) {
  // The request socket, the heartbeat socket (when open), the request channel (when taken);
  // a raw fd's item has no socket, and an item of neither is skipped by zmq_poll.
  zmq::pollitem_t items[3] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                              {beat_socket_ ? beat_socket_->handle() : nullptr, -1, ZMQ_POLLIN, 0},
                              {nullptr, channel_ ? channel_.get() : -1, ZMQ_POLLIN, 0}};
  const size_t polled = channel_ ? 3 : beat_socket_ ? 2 : 1;
  Heard heard;
  if (zmq::poll(items, polled, left) == 0) return heard;
  heard.reply = (items[0].revents & ZMQ_POLLIN) != 0 ||
                (polled == 3 && (items[2].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) != 0);
  std::vector<zmq::message_t> frames;
  if (!beat_socket_ || !(items[1].revents & ZMQ_POLLIN) ||
      !zmq::recv_multipart(*beat_socket_, std::back_inserter(frames), zmq::recv_flags::dontwait))
    return heard;
  // Anything the service sends on the heartbeat connection is a sign of life; only a Pong to
  // one of this client's Pings can report progress.
  heard.beat = true;
  auto env = msg::split_envelope(frames);
  if (!env) return heard;
  auto decoded = msg::decode(env->body);
  if (!decoded || pings_.erase(decoded->header.request_id) == 0) return heard;
  const auto* pong = std::get_if<msg::Pong>(&decoded->header.body);
  heard.advanced = pong && pong_advanced(last_pong_, *pong);
  return heard;
}

ServiceFailure OffloadClient::silence(uint64_t id, const std::string& kind,
                                      std::chrono::milliseconds waited, bool dead) const {
  const msg::Pong& p = last_pong_;
  std::string in_flight = "no operation of job '" + job_id_ + "' in flight there";
  if (!p.operation.empty()) {
    in_flight = "in flight there: " + p.operation;
    if (p.step > 0) in_flight += " of step " + std::to_string(p.step);
    if (p.total > 0)
      in_flight += ", " + std::to_string(p.done) + "/" + std::to_string(p.total) + " partitions";
    in_flight += ", for " + std::to_string(p.elapsed_ms / 1000) + " s";
  }
  const std::string what = kind + " (request " + std::to_string(id) + ")";
  const std::string message =
      dead ? "offload service at " + endpoint_ + " answered neither " + what +
                 " nor its heartbeats for " + std::to_string(waited.count()) +
                 " ms: it is down or unreachable (last heard: " + in_flight + ")"
           : "offload service at " + endpoint_ + " did not answer " + kind + " within " +
                 std::to_string(timeout_.count()) + " ms without progress (request " +
                 std::to_string(id) + ", no word for " + std::to_string(waited.count()) + " ms; " +
                 in_flight + ")";
  return ServiceFailure{ServiceFailure::Kind::timeout, msg::ErrorCode::internal, message};
}

template <class T>
ServiceResult<T> OffloadClient::await_as(uint64_t id, ArenaBuffer* slot) {
  const auto sent = outstanding_.find(id);
  const std::string kind = sent != outstanding_.end() ? sent->second.kind : "a request";
  ServiceResult<Reply> reply = await(id);
  if (!reply.ok()) return std::move(reply.error());
  if (slot) *slot = std::move(reply->arena);
  msg::Body& body = reply->header.body;
  if (auto* e = std::get_if<msg::ErrorReply>(&body))
    return ServiceFailure{ServiceFailure::Kind::refused, e->code, std::move(e->message)};
  if (auto* t = std::get_if<T>(&body)) return std::move(*t);
  return failure("answered " + kind + " with " + std::string(msg::kind_name(body)));
}

ServiceResult<LentPush> OffloadClient::await_push(uint64_t id) {
  ArenaBuffer slot;
  ServiceResult<msg::PushReply> reply = await_as<msg::PushReply>(id, &slot);
  if (!reply.ok()) return std::move(reply.error());
  LentPush out{reply.value(), {}};
  // Not kept: the slot is free again as the reply goes.
  if (reply->kept) out.lent = std::move(slot);
  return out;
}

template ServiceResult<msg::RegisterReply> OffloadClient::await_as(uint64_t, ArenaBuffer*);
template ServiceResult<msg::SetParametersReply> OffloadClient::await_as(uint64_t, ArenaBuffer*);
template ServiceResult<msg::PushReply> OffloadClient::await_as(uint64_t, ArenaBuffer*);
template ServiceResult<msg::CommitReply> OffloadClient::await_as(uint64_t, ArenaBuffer*);
template ServiceResult<msg::StatsReply> OffloadClient::await_as(uint64_t, ArenaBuffer*);
template ServiceResult<msg::CheckpointReply> OffloadClient::await_as(uint64_t, ArenaBuffer*);
template ServiceResult<msg::RestoreReply> OffloadClient::await_as(uint64_t, ArenaBuffer*);
template ServiceResult<msg::DropJobReply> OffloadClient::await_as(uint64_t, ArenaBuffer*);
template ServiceResult<msg::DeleteCheckpointReply> OffloadClient::await_as(uint64_t, ArenaBuffer*);

MasterViewMapping::MasterViewMapping(std::shared_ptr<const messages::UniqueFd> fd, size_t bytes)
    : fd_(std::move(fd)), size_(bytes) {
  if (!fd_ || !*fd_) throw std::runtime_error("master view: no fd to map");
  // Pages past the file's end would raise SIGBUS when read: only a memfd sealed against
  // shrinking is mapped, so a file long enough now stays so.
  messages::check_sealed_memfd(fd_->get(), bytes, "master view");
  if (bytes == 0) return;
  // At a 2 MiB boundary: the service's masters are in 2 MiB pages where the host allows
  // (offload_service/host_memory.cpp), and each is then mapped with one entry.
  void* p = messages::map_huge_aligned(bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd_->get(), 0);
  if (p == MAP_FAILED)
    throw std::runtime_error(std::string("mmap of a master view: ") + std::strerror(errno));
  data_ = static_cast<const std::byte*>(p);
}

MasterViewMapping::~MasterViewMapping() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

std::optional<ServiceFailure> OffloadClient::map_view(FetchedParameters& out) {
  if (auto f = collect_view(out)) return f;
  const uint64_t pid = out.reply.partition_id;
  try {
    out.view = std::make_shared<const MasterViewMapping>(views_[pid].fd,
                                                         out.reply.element_count * sizeof(float));
  } catch (const std::exception& e) {
    return failure("fetch of partition " + std::to_string(pid) + ": " + e.what());
  }
  return std::nullopt;
}

std::optional<ServiceFailure> OffloadClient::collect_view(FetchedParameters& out) {
  const msg::MasterView& v = *out.reply.master_view;
  const uint64_t pid = out.reply.partition_id;
  HeldView& held = views_[pid];
  if (!v.ticket.empty()) {
    try {
      held = HeldView{v.view_id, std::make_shared<const messages::UniqueFd>(
                                     messages::collect_fd(v.socket, v.ticket, timeout_))};
    } catch (const std::exception& e) {
      views_.erase(pid);
      return failure("fetch of partition " + std::to_string(pid) + ": " + e.what());
    }
  } else if (held.view_id != v.view_id || !held.fd) {
    const uint64_t had = held.view_id;
    views_.erase(pid);
    return failure("answered a fetch of partition " + std::to_string(pid) + " with master view " +
                   std::to_string(v.view_id) + " and no ticket, this client holds " +
                   (had ? "view " + std::to_string(had) : std::string("none")));
  }
  return std::nullopt;
}

std::span<const std::byte> FetchedParameters::bytes() const {
  if (in_view()) return view->bytes();
  if (in_arena()) return arena_bytes;
  if (in_parts())
    throw std::logic_error("a fetch reply that came in parts has no single span (pieces())");
  return {static_cast<const std::byte*>(frame.data()), frame.size()};
}

std::vector<std::span<const std::byte>> FetchedParameters::pieces() const {
  if (!in_parts()) return {bytes()};
  std::vector<std::span<const std::byte>> out;
  out.reserve(parts.size());
  for (const zmq::message_t& p : parts)
    out.emplace_back(static_cast<const std::byte*>(p.data()), p.size());
  return out;
}

size_t FetchedParameters::size_bytes() const {
  if (!in_parts()) return bytes().size();
  size_t n = 0;
  for (const zmq::message_t& p : parts) n += p.size();
  return n;
}

void OffloadClient::set_fetch_part_bytes(size_t bytes) {
  bytes -= bytes % 8;
  if (!msg::valid_reply_part_bytes(bytes))
    throw std::invalid_argument("fetch part bytes " + std::to_string(bytes) + ": allowed are " +
                                msg::kReplyPartBytesRule);
  fetch_part_bytes_ = bytes;
}

ServiceResult<FetchedParameters> OffloadClient::await_fetch(uint64_t id) {
  // The slot the request offered, before await() hands it over with the reply.
  std::optional<msg::ArenaSlice> offered;
  if (auto l = leases_.find(id); l != leases_.end() && l->second.own)
    offered = msg::ArenaSlice{l->second.own.pool_->arena_id(), l->second.own.offset(),
                              l->second.own.bytes().size(), 0};
  bool accepted_view = false;
  if (auto o = outstanding_.find(id); o != outstanding_.end())
    if (auto* f = std::get_if<msg::FetchParameters>(&o->second.header.body))
      accepted_view = f->accept_master_view;
  ServiceResult<Reply> reply = await(id);
  if (!reply.ok()) return std::move(reply.error());
  msg::Body& body = reply->header.body;
  if (auto* e = std::get_if<msg::ErrorReply>(&body))
    return ServiceFailure{ServiceFailure::Kind::refused, e->code, std::move(e->message)};
  auto* fetched = std::get_if<msg::FetchReply>(&body);
  if (!fetched)
    return failure("answered fetchParameters with " + std::string(msg::kind_name(body)));
  FetchedParameters out;
  out.reply = std::move(*fetched);
  out.frame = std::move(reply->payload);
  out.parts = std::move(reply->payload_parts);
  out.arena = std::move(reply->arena);
  if (out.reply.master_view) {
    if (!offered || !accepted_view)
      return failure("answered a fetch of partition " + std::to_string(out.reply.partition_id) +
                     " that accepted no master view with one");
    const size_t bytes = out.reply.element_count * sizeof(float);
    if (master_view_use_ == MasterViewUse::read && out.arena && out.arena.bytes().size() >= bytes) {
      // Copied into the slot the request offered: the bytes are then the slot's, as if the
      // service had written them, and the view's fd is kept to read it again.
      if (auto f = collect_view(out)) return std::move(*f);
      out.view_file = views_[out.reply.partition_id].fd;
      try {
        read_master_view(out.view_file->get(), out.arena.bytes().first(bytes));
      } catch (const std::exception& e) {
        return failure("fetch of partition " + std::to_string(out.reply.partition_id) + ": " +
                       e.what());
      }
      out.arena_bytes = out.arena.bytes().first(bytes);
      out.arena.pool_->set_used(out.arena.slot_, bytes);
      return out;
    }
    // Nothing was written into the slot: free again at once.
    if (out.arena) out.arena.pool_->set_used(out.arena.slot_, 0);
    out.arena = {};
    if (auto f = map_view(out)) return std::move(*f);
    return out;
  }
  if (!out.reply.arena) {
    // The service answered with a frame (a partition larger than the slot): untouched.
    if (out.arena) out.arena.pool_->set_used(out.arena.slot_, 0);
    out.arena = {};
    return out;
  }
  const msg::ArenaSlice& a = *out.reply.arena;
  if (!offered || a.arena_id != offered->arena_id || a.offset != offered->offset ||
      a.length > offered->length)
    return failure("answered fetch of partition " + std::to_string(out.reply.partition_id) +
                   " with arena range [" + std::to_string(a.offset) + ", +" +
                   std::to_string(a.length) + ") of arena " + std::to_string(a.arena_id) +
                   (offered ? ", asked [" + std::to_string(offered->offset) + ", +" +
                                  std::to_string(offered->length) + ") of " +
                                  std::to_string(offered->arena_id)
                            : ", asked for a frame"));
  out.arena_bytes = out.arena.bytes().first(a.length);
  out.arena.pool_->set_used(out.arena.slot_, a.length);  // what the service wrote
  if (!arena_checksums_) return out;
  if (a.crc_omitted)
    return failure("wrote partition " + std::to_string(out.reply.partition_id) +
                   " into the arena without the crc32c asked for");
  const uint32_t crc = checksum::crc32c(out.arena_bytes.data(), out.arena_bytes.size());
  if (crc != a.crc32c)
    return failure("wrote partition " + std::to_string(out.reply.partition_id) +
                   " into the arena with crc32c " + std::to_string(crc) + ", the reply declares " +
                   std::to_string(a.crc32c));
  return out;
}

// ---- throwing calls ---------------------------------------------------------------------

void throw_failure(const ServiceFailure& f) {
  switch (f.kind) {
    case ServiceFailure::Kind::timeout:
      throw OffloadTimeout(f.message);
    case ServiceFailure::Kind::refused:
      throw OffloadError(f.code, f.message);
    case ServiceFailure::Kind::failed:
      break;
  }
  throw std::runtime_error(f.message);
}

msg::Header OffloadClient::receive(uint64_t id, zmq::message_t* payload_frame, ArenaBuffer* arena) {
  Reply r = value_or_throw(await(id));
  if (payload_frame && r.payload.size() > 0) *payload_frame = std::move(r.payload);
  if (arena) *arena = std::move(r.arena);
  return std::move(r.header);
}

msg::Header OffloadClient::call(msg::Body body, std::span<const std::byte> payload,
                                std::shared_ptr<const void> owner, zmq::message_t* payload_frame) {
  return receive(send(std::move(body), payload, std::move(owner)), payload_frame);
}

bool OffloadClient::map_arena(size_t slot_bytes, size_t slots, SlotKeep keep) {
  return value_or_throw(try_map_arena(slot_bytes, slots, keep));
}

msg::RegisterReply OffloadClient::register_partitions(uint32_t rank, uint32_t world_size,
                                                      std::vector<msg::PartitionSpec> specs) {
  return value_or_throw(
      await_as<msg::RegisterReply>(send(msg::Register{rank, world_size, std::move(specs)})));
}

msg::SetParametersReply OffloadClient::set_parameters(uint64_t partition_id, uint64_t version,
                                                      msg::DType dtype,
                                                      std::span<const std::byte> values,
                                                      std::shared_ptr<const void> owner) {
  return value_or_throw(await_as<msg::SetParametersReply>(
      send_set_parameters(partition_id, version, dtype, values, std::move(owner))));
}

msg::PushReply OffloadClient::push_gradients(uint64_t partition_id, uint64_t step,
                                             uint32_t micro_step, msg::DType dtype,
                                             std::span<const std::byte> grads,
                                             std::shared_ptr<const void> owner) {
  return value_or_throw(push(partition_id, step, micro_step, dtype, grads, std::move(owner)));
}

ServiceResult<msg::PushReply> OffloadClient::push(uint64_t partition_id, uint64_t step,
                                                  uint32_t micro_step, msg::DType dtype,
                                                  std::span<const std::byte> grads,
                                                  std::shared_ptr<const void> owner) {
  const size_t element = msg::dtype_size(dtype);
  const uint64_t n = grads.size() / element;
  const uint64_t range = push_range_elements(push_range_bytes_, element);
  if (micro_step != 0 || range == 0 || n <= range)
    return await_as<msg::PushReply>(
        send_push_gradients(partition_id, step, micro_step, dtype, grads, std::move(owner)));
  if (!owner) {  // borrowed bytes: one copy for every range (send() would copy each)
    auto copy = std::make_shared<std::vector<std::byte>>(grads.begin(), grads.end());
    grads = *copy;
    owner = std::move(copy);
  }
  return push_ranges(n, range, [&](uint64_t at, uint64_t count) {
    return send(msg::PushGradients{partition_id, step, 0, dtype, n, {}, at, count},
                grads.subspan(at * element, count * element), owner);
  });
}

ServiceResult<msg::PushReply> OffloadClient::push_copied(uint64_t partition_id, uint64_t step,
                                                         uint32_t micro_step, msg::DType dtype,
                                                         std::span<const std::byte> grads,
                                                         ArenaBuffer slot) {
  const size_t element = msg::dtype_size(dtype);
  // Streamed stores: the service reads these bytes from another core, this thread never
  // does again. The crc, when arena checksums are on, rides on the copy.
  return push_into_slot(
      "push_copied", partition_id, step, micro_step, dtype, grads.size() / element, std::move(slot),
      [&](std::byte* dst, uint64_t at, uint64_t count) -> std::optional<uint32_t> {
        const std::byte* src = grads.data() + at * element;
        if (arena_checksums_) return checksum::crc32c_stream_copy(dst, src, count * element);
        checksum::stream_copy(dst, src, count * element);
        return std::nullopt;
      });
}

ServiceResult<msg::PushReply> OffloadClient::push_filled(uint64_t partition_id, uint64_t step,
                                                         uint32_t micro_step, msg::DType dtype,
                                                         uint64_t count, const PushFill& fill,
                                                         ArenaBuffer slot) {
  const size_t element = msg::dtype_size(dtype);
  // The written range is still in this core's cache when its crc reads it.
  return push_into_slot("push_filled", partition_id, step, micro_step, dtype, count,
                        std::move(slot),
                        [&](std::byte* dst, uint64_t at, uint64_t n) -> std::optional<uint32_t> {
                          fill(dst, at, n);
                          if (!arena_checksums_) return std::nullopt;
                          return checksum::crc32c(dst, n * element);
                        });
}

ServiceResult<msg::PushReply> OffloadClient::push_into_slot(const char* caller,
                                                            uint64_t partition_id, uint64_t step,
                                                            uint32_t micro_step, msg::DType dtype,
                                                            uint64_t n, ArenaBuffer slot,
                                                            const FillRange& fill) {
  const size_t element = msg::dtype_size(dtype);
  if (!slot || slot.pool_ != pool_.get() || n > slot.bytes().size() / element)
    throw std::invalid_argument(std::string(caller) + ": " + std::to_string(n) + " elements of " +
                                std::to_string(element) +
                                " bytes do not fit the arena buffer given");
  const uint64_t range = push_range_elements(push_range_bytes_, element);
  if (micro_step != 0 || range == 0 || n <= range) {
    if (const auto crc = fill(slot.bytes().data(), 0, n))
      slot.copied_ = std::pair{n * element, *crc};  // the bytes the push declares
    return await_as<msg::PushReply>(
        send_push_gradients(partition_id, step, micro_step, dtype, n, std::move(slot)));
  }
  // Every range holds the slot; the last of them to be answered frees it.
  auto held = std::make_shared<ArenaBuffer>(std::move(slot));
  // Each range's crc (when checked), by index: a restart sends the filled ranges again.
  std::vector<std::optional<uint32_t>> crcs;
  return push_ranges(n, range, [&](uint64_t at, uint64_t count) {
    const size_t index = at / range;
    if (index == crcs.size()) crcs.push_back(fill(held->bytes().data() + at * element, at, count));
    msg::PushGradients push{partition_id, step, 0, dtype, n, {}, at, count};
    push.arena = msg::ArenaSlice{pool_->arena_id(), held->offset() + at * element, count * element,
                                 crcs[index].value_or(0), !crcs[index]};
    const uint64_t id = send(push);
    leases_.emplace(id, Lease{{}, held});
    return id;
  });
}

ServiceResult<msg::PushReply> OffloadClient::push_ranges(
    uint64_t n, uint64_t range, const std::function<uint64_t(uint64_t, uint64_t)>& send_range) {
  constexpr int kRestarts = 2;
  size_t window = kPushRangeWindow;
  for (int attempt = 0;; ++attempt) {
    std::deque<uint64_t> unanswered;
    uint64_t at = 0;
    auto send_next = [&] {
      const uint64_t count = std::min(range, n - at);
      unanswered.push_back(send_range(at, count));
      at += count;
    };
    while (at < n && unanswered.size() < window) send_next();
    std::optional<ServiceFailure> failure;
    ServiceResult<msg::PushReply> last = ServiceFailure{};
    while (!unanswered.empty()) {
      const uint64_t id = unanswered.front();
      unanswered.pop_front();
      if (failure && failure->kind != ServiceFailure::Kind::refused) {
        forget(id);  // the service is gone or unusable: no more waiting, once per range
        continue;
      }
      auto r = await_as<msg::PushReply>(id);
      if (!r.ok() && !failure) failure = r.error();
      if (!failure && at < n) send_next();
      if (unanswered.empty()) last = std::move(r);
    }
    if (!failure) return last;
    if (attempt == kRestarts || failure->kind != ServiceFailure::Kind::refused ||
        failure->code != msg::ErrorCode::versionOrder)
      return *failure;
    // A service that turns ranges away as busy (a lower in-flight limit) gets fewer at a time:
    // 2, then 1, with which a busy range is sent again before the next one goes.
    window = std::max<size_t>(1, window / 4);
  }
}

msg::PushReply OffloadClient::receive_push_reply(uint64_t request_id) {
  return value_or_throw(await_as<msg::PushReply>(request_id));
}

msg::CommitReply OffloadClient::commit(const msg::CommitStep& commit) {
  return value_or_throw(await_as<msg::CommitReply>(send(commit)));
}

msg::CommitReply OffloadClient::skip(uint64_t step) {
  return value_or_throw(await_as<msg::CommitReply>(send(msg::SkipStep{step})));
}

ServiceResult<msg::FetchReply> OffloadClient::fetch_into(uint64_t partition_id,
                                                         uint64_t min_version, msg::DType dtype,
                                                         uint64_t count, const FetchTake& take) {
  const size_t element = msg::dtype_size(dtype);
  ArenaBuffer slot = fetch_slot(count * element);
  const uint64_t range = push_range_elements(fetch_part_bytes_, element);
  if (slot || range == 0 || count <= range) {
    ServiceResult<FetchedParameters> f = await_fetch(send_fetch_request(
        msg::FetchParameters{partition_id, min_version, dtype, {}, fetch_part_bytes_},
        std::move(slot)));
    if (!f.ok()) return std::move(f.error());
    msg::FetchReply head = f->reply;
    take(std::move(f.value()));
    return head;
  }
  std::deque<std::pair<uint64_t, uint64_t>> unanswered;  // request id, first element
  uint64_t at = 0;
  auto send_next = [&] {
    msg::FetchParameters request{partition_id, min_version, dtype, {}, 0};
    request.range_offset = at;
    request.range_count = std::min(range, count - at);
    unanswered.emplace_back(send(request), at);
    at += request.range_count;
  };
  auto abandon_rest = [&] {
    for (const auto& [id, first] : unanswered) forget(id);
    unanswered.clear();
  };
  while (at < count && unanswered.size() < kFetchRangeWindow) send_next();
  std::optional<msg::FetchReply> head;
  while (!unanswered.empty()) {
    const auto [id, first] = unanswered.front();
    unanswered.pop_front();
    ServiceResult<FetchedParameters> f = await_fetch(id);
    if (!f.ok()) {
      abandon_rest();
      return std::move(f.error());
    }
    const msg::FetchReply& r = f->reply;
    if (!head && !r.ranged() && r.partition_id == partition_id && r.dtype == dtype &&
        r.element_count == count) {
      // A service older than ranges answers the first with the whole partition: taken as
      // the whole fetch (the others' whole answers are skipped as they come).
      abandon_rest();
      msg::FetchReply whole = r;
      take(std::move(f.value()));
      return whole;
    }
    const uint64_t n = std::min(range, count - first);
    if (r.partition_id != partition_id || r.dtype != dtype || r.element_count != count ||
        r.range_offset != first || r.range_count != n || (head && r.version != head->version)) {
      abandon_rest();
      return failure(
          "answered the fetch of elements [" + std::to_string(first) + ", +" + std::to_string(n) +
          ") of partition " + std::to_string(partition_id) + " (" + std::to_string(count) + " " +
          std::string(msg::to_string(dtype)) + ") with elements [" +
          std::to_string(r.range_offset) + ", +" + std::to_string(r.range_count) +
          ") of partition " + std::to_string(r.partition_id) + " (" +
          std::to_string(r.element_count) + " " + std::string(msg::to_string(r.dtype)) +
          ") at version " + std::to_string(r.version) +
          (head ? ", its first range at version " + std::to_string(head->version) : std::string()));
    }
    if (!head) {
      head = r;
      head->range_offset = 0;
      head->range_count = 0;
    }
    if (at < count) send_next();  // on the wire while this range is taken
    try {
      take(std::move(f.value()));
    } catch (...) {
      abandon_rest();
      throw;
    }
  }
  return *head;
}

FetchedParameters OffloadClient::fetch(uint64_t partition_id, uint64_t min_version,
                                       msg::DType dtype) {
  return value_or_throw(await_fetch(send_fetch(partition_id, min_version, dtype)));
}

msg::StatsReply OffloadClient::stats() {
  return value_or_throw(await_as<msg::StatsReply>(send(msg::Stats{})));
}

msg::CheckpointReply OffloadClient::checkpoint(const std::string& tag, const std::string& name) {
  return value_or_throw(await_as<msg::CheckpointReply>(send(msg::Checkpoint{tag, {}, name})));
}

msg::RestoreReply OffloadClient::restore(const std::string& tag, const std::string& name) {
  return value_or_throw(await_as<msg::RestoreReply>(send(msg::Restore{tag, {}, name})));
}

msg::DropJobReply OffloadClient::drop_job() {
  return value_or_throw(await_as<msg::DropJobReply>(send(msg::DropJob{})));
}

msg::DeleteCheckpointReply OffloadClient::delete_checkpoint(const std::string& name) {
  return value_or_throw(await_as<msg::DeleteCheckpointReply>(send(msg::DeleteCheckpoint{name})));
}

}  // namespace dsactor::actors
