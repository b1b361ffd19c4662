#include "actors/offload_link/offload_client.h"

#include <spdlog/spdlog.h>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>

#include <zmq_addon.hpp>

#include "checksum/crc32c.h"
#include "messages/shm_arena.h"

namespace dsactor::actors {

namespace msg = dsactor::messages;
using Clock = std::chrono::steady_clock;

OffloadError::OffloadError(msg::ErrorCode code, const std::string& message)
    : std::runtime_error(std::string(msg::to_string(code)) + ": " + message), code_(code) {}

OffloadClient::OffloadClient(std::string endpoint, std::chrono::milliseconds timeout,
                             std::string job_id)
    : endpoint_(std::move(endpoint)),
      timeout_(timeout),
      job_id_(std::move(job_id)),
      context_(1),
      socket_(context_, zmq::socket_type::dealer) {
  // Nothing may wait in ~OffloadClient for an unreachable service.
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::sndhwm, 0);
  socket_.set(zmq::sockopt::rcvhwm, 0);
  socket_.connect(endpoint_);
}

OffloadClient::~OffloadClient() {
  unmap_arena();
}

// ---- arena ----------------------------------------------------------------------------

ArenaBuffer::ArenaBuffer(ArenaBuffer&& o) noexcept
    : client_(std::exchange(o.client_, nullptr)),
      slot_(o.slot_),
      offset_(o.offset_),
      bytes_(o.bytes_) {}

ArenaBuffer& ArenaBuffer::operator=(ArenaBuffer&& o) noexcept {
  if (this != &o) {
    release();
    client_ = std::exchange(o.client_, nullptr);
    slot_ = o.slot_;
    offset_ = o.offset_;
    bytes_ = o.bytes_;
  }
  return *this;
}

ArenaBuffer::~ArenaBuffer() {
  release();
}

void ArenaBuffer::release() {
  if (client_) client_->release_slot(slot_);
  client_ = nullptr;
}

bool OffloadClient::map_arena(size_t slot_bytes, size_t slots, size_t keep_bytes) {
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
  const msg::Header reply = call(msg::MapArena{arena->path(), arena->size()});
  if (const auto* e = std::get_if<msg::ErrorReply>(&reply.body))
    return fallback(std::string(msg::to_string(e->code)) + ": " + e->message);
  const auto* ok = std::get_if<msg::MapArenaReply>(&reply.body);
  if (!ok || ok->arena_id == 0 || ok->size != arena->size())
    return fallback("unexpected reply " + std::string(msg::kind_name(reply.body)));
  arena_ = std::move(arena);
  arena_id_ = ok->arena_id;
  slot_bytes_ = slot;
  // Compared before rounding up: keep_bytes may be SIZE_MAX ("keep everything").
  keep_bytes_ = keep_bytes >= slot ? slot : (keep_bytes + page - 1) / page * page;
  slot_busy_.assign(slots, 0);
  slot_used_.assign(slots, 0);
  slot_resident_.assign(slots, 0);
  spdlog::debug("offload client: {} maps our {}-byte arena as {}", endpoint_, arena_->size(),
                arena_id_);
  return true;
}

size_t OffloadClient::arena_bytes() const {
  return has_arena() ? arena_->size() : 0;
}

void OffloadClient::unmap_arena() {
  if (!has_arena()) return;
  // Best effort: a service that is gone unmaps everything when it stops anyway. The
  // linger lets the request leave before the socket closes, without waiting for a reply.
  try {
    send(msg::UnmapArena{arena_id_});
    socket_.set(zmq::sockopt::linger, 200);
  } catch (const std::exception&) {
  }
  arena_id_ = 0;
}

void OffloadClient::release_slot(size_t slot) {
  std::lock_guard lock(slots_mu_);
  slot_busy_[slot] = 0;
  const size_t used = std::exchange(slot_used_[slot], 0);
  if (used <= keep_bytes_) {
    slot_resident_[slot] = std::max(slot_resident_[slot], used);
    return;
  }
  // A large payload's slot keeps nothing: what it touched is given back whole, so the
  // slot holds no pages until its next use (the large one is rare, and its first
  // keep_bytes would sit idle through the memory peaks between). MADV_REMOVE frees the
  // memfd's pages (for the service's mapping too); they read back as zeros and are
  // faulted in again by the next use that needs them.
  const size_t page = 4096;
  const size_t end = std::min(slot_bytes_, (used + page - 1) / page * page);
  madvise(arena_->data() + slot * slot_bytes_, end, MADV_REMOVE);
  slot_resident_[slot] = 0;
}

void OffloadClient::set_slot_used(size_t slot, size_t bytes) {
  std::lock_guard lock(slots_mu_);
  slot_used_[slot] = bytes;
}

size_t OffloadClient::trim_free_slots() {
  std::lock_guard lock(slots_mu_);
  size_t given = 0;
  const size_t page = 4096;
  for (size_t i = 0; i < slot_busy_.size(); ++i) {
    if (slot_busy_[i] || slot_resident_[i] == 0) continue;
    const size_t bytes = (slot_resident_[i] + page - 1) / page * page;
    madvise(arena_->data() + i * slot_bytes_, std::min(bytes, slot_bytes_), MADV_REMOVE);
    given += slot_resident_[i];
    slot_resident_[i] = 0;
  }
  return given;
}

ArenaBuffer OffloadClient::arena_buffer(size_t bytes) {
  ArenaBuffer b;
  if (!has_arena() || bytes > slot_bytes_) return b;
  std::lock_guard lock(slots_mu_);
  for (size_t i = 0; i < slot_busy_.size(); ++i) {
    if (slot_busy_[i]) continue;
    slot_busy_[i] = 1;
    slot_used_[i] = bytes;
    b.client_ = this;
    b.slot_ = i;
    b.offset_ = i * slot_bytes_;
    b.bytes_ = {arena_->data() + b.offset_, slot_bytes_};
    return b;
  }
  return b;
}

void OffloadClient::forget(uint64_t id) {
  outstanding_.erase(id);
  if (auto l = leases_.find(id); l != leases_.end()) {
    stale_.insert_or_assign(id, std::move(l->second));
    leases_.erase(l);
  }
}

msg::Header OffloadClient::call(msg::Body body, std::span<const std::byte> payload,
                                std::shared_ptr<const void> owner, zmq::message_t* payload_frame) {
  return receive(send(std::move(body), payload, std::move(owner)), payload_frame);
}

uint64_t OffloadClient::send(msg::Body body, std::span<const std::byte> payload,
                             std::shared_ptr<const void> owner) {
  const uint64_t id = next_id_++;
  msg::Header header{id, job_id_, std::move(body)};
  const std::string kind(msg::kind_name(header.body));
  std::vector<zmq::message_t> frames;
  if (!msg::has_payload(header.body)) {
    frames = msg::encode(header);
  } else if (owner) {
    frames = msg::encode(header, payload, std::move(owner));
  } else {
    frames = msg::encode_copy(header, payload);
  }
  zmq::send_multipart(socket_, msg::with_envelope({}, std::move(frames)));
  outstanding_.emplace(id, kind);
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

msg::Header OffloadClient::receive(uint64_t id, zmq::message_t* payload_frame, ArenaBuffer* arena) {
  auto take = [&](Reply& r) {
    if (payload_frame && r.payload.size() > 0) *payload_frame = std::move(r.payload);
    if (auto l = leases_.find(id); l != leases_.end()) {
      if (arena) *arena = std::move(l->second);
      leases_.erase(l);
    }
    return std::move(r.header);
  };
  if (auto it = arrived_.find(id); it != arrived_.end()) {
    msg::Header h = take(it->second);
    arrived_.erase(it);
    return h;
  }
  const auto waiting = outstanding_.find(id);
  if (waiting == outstanding_.end())
    throw std::logic_error("offload client for " + endpoint_ + ": request " + std::to_string(id) +
                           " is not outstanding");
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (left.count() <= 0 || zmq::poll(&item, 1, left) == 0) {
      const std::string kind = waiting->second;
      forget(id);  // a reply that still comes is discarded
      throw OffloadTimeout("offload service at " + endpoint_ + " did not answer " + kind +
                           " (request " + std::to_string(id) + ") within " +
                           std::to_string(timeout_.count()) + " ms");
    }
    std::vector<zmq::message_t> reply;
    if (!zmq::recv_multipart(socket_, std::back_inserter(reply))) continue;
    auto env = msg::split_envelope(reply);
    if (!env) continue;
    auto decoded = msg::decode(env->body);
    if (!decoded) {
      throw std::runtime_error("offload service at " + endpoint_ +
                               " sent an undecodable reply: " + decoded.error().message);
    }
    const uint64_t rid = decoded->header.request_id;
    // The gateway's answer to a request it could not read (id 0) is taken as this one's,
    // the request being waited for.
    const bool mine =
        rid == id || (rid == 0 && std::holds_alternative<msg::ErrorReply>(decoded->header.body));
    const bool other = !mine && outstanding_.count(rid) > 0;
    if (!mine && !other) {  // a late reply to a request that timed out: skip it
      stale_.erase(rid);    // the service is done with its slot
      continue;
    }
    Reply r{std::move(decoded->header), {}};
    if (msg::has_payload(r.header.body) && env->body.size() == 2) {
      // The decoded payload views reply's last frame; keep the frame itself.
      r.payload = std::move(reply.back());
    }
    if (other) {  // a pipelined request's reply: its own receive() takes it
      outstanding_.erase(rid);
      arrived_.emplace(rid, std::move(r));
      continue;
    }
    outstanding_.erase(waiting);
    return take(r);
  }
}

template <class T>
T OffloadClient::expect(msg::Header reply, const char* what) {
  if (auto* e = std::get_if<msg::ErrorReply>(&reply.body)) throw OffloadError(e->code, e->message);
  if (auto* t = std::get_if<T>(&reply.body)) return std::move(*t);
  throw std::runtime_error("offload service at " + endpoint_ + " answered " + what + " with " +
                           std::string(msg::kind_name(reply.body)));
}

msg::RegisterReply OffloadClient::register_partitions(uint32_t rank, uint32_t world_size,
                                                      std::vector<msg::PartitionSpec> specs) {
  return expect<msg::RegisterReply>(call(msg::Register{rank, world_size, std::move(specs)}),
                                    "register");
}

msg::SetParametersReply OffloadClient::set_parameters(uint64_t partition_id, uint64_t version,
                                                      msg::DType dtype,
                                                      std::span<const std::byte> values,
                                                      std::shared_ptr<const void> owner) {
  const uint64_t n = values.size() / msg::dtype_size(dtype);
  return expect<msg::SetParametersReply>(
      call(msg::SetParameters{partition_id, version, dtype, n}, values, std::move(owner)),
      "setParameters");
}

msg::PushReply OffloadClient::push_gradients(uint64_t partition_id, uint64_t step,
                                             uint32_t micro_step, msg::DType dtype,
                                             std::span<const std::byte> grads,
                                             std::shared_ptr<const void> owner) {
  const uint64_t n = grads.size() / msg::dtype_size(dtype);
  return expect<msg::PushReply>(
      call(msg::PushGradients{partition_id, step, micro_step, dtype, n, {}}, grads,
           std::move(owner)),
      "pushGradients");
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
                                            ArenaBuffer grads) {
  const uint64_t bytes = count * msg::dtype_size(dtype);
  if (!grads || grads.client_ != this || bytes > grads.bytes().size())
    throw std::invalid_argument("send_push_gradients: " + std::to_string(bytes) +
                                " bytes do not fit the arena buffer given");
  const uint32_t crc = checksum::crc32c(grads.bytes().data(), bytes);
  msg::PushGradients push{partition_id, step, micro_step, dtype, count, {}};
  push.arena = msg::ArenaSlice{arena_id_, grads.offset(), bytes, crc};
  const uint64_t id = send(push);
  leases_.emplace(id, std::move(grads));
  return id;
}

msg::PushReply OffloadClient::receive_push_reply(uint64_t request_id) {
  return expect<msg::PushReply>(receive(request_id), "pushGradients");
}

msg::CommitReply OffloadClient::commit(const msg::CommitStep& commit) {
  return expect<msg::CommitReply>(call(commit), "commitStep");
}

msg::CommitReply OffloadClient::skip(uint64_t step) {
  return expect<msg::CommitReply>(call(msg::SkipStep{step}), "skipStep");
}

FetchedParameters OffloadClient::fetch(uint64_t partition_id, uint64_t min_version,
                                       msg::DType dtype) {
  FetchedParameters out;
  msg::FetchParameters request{partition_id, min_version, dtype, {}};
  ArenaBuffer slot = arena_buffer(slot_bytes_);
  if (!slot) {
    out.reply = expect<msg::FetchReply>(call(request, {}, nullptr, &out.frame), "fetchParameters");
    return out;
  }
  request.arena = msg::ArenaSlice{arena_id_, slot.offset(), slot.bytes().size(), 0};
  const std::span<std::byte> region = slot.bytes();
  const uint64_t id = send(request);
  leases_.emplace(id, std::move(slot));
  out.reply = expect<msg::FetchReply>(receive(id, &out.frame, &out.arena), "fetchParameters");
  if (!out.reply.arena) {
    // The service answered with a frame (a partition larger than the slot): untouched.
    if (out.arena) set_slot_used(out.arena.slot_, 0);
    out.arena = {};
    return out;
  }
  const msg::ArenaSlice& a = *out.reply.arena;
  if (a.arena_id != arena_id_ || a.offset != request.arena->offset || a.length > region.size())
    throw std::runtime_error("offload service at " + endpoint_ + " answered fetch of partition " +
                             std::to_string(partition_id) + " with arena range [" +
                             std::to_string(a.offset) + ", +" + std::to_string(a.length) +
                             ") of arena " + std::to_string(a.arena_id) + ", asked [" +
                             std::to_string(request.arena->offset) + ", +" +
                             std::to_string(region.size()) + ") of " + std::to_string(arena_id_));
  out.arena_bytes = region.first(a.length);
  set_slot_used(out.arena.slot_, a.length);  // what the service wrote
  // The frame path's decode verifies the crc; the arena path keeps that guarantee.
  const uint32_t crc = checksum::crc32c(out.arena_bytes.data(), out.arena_bytes.size());
  if (crc != a.crc32c)
    throw OffloadError(msg::ErrorCode::checksumMismatch,
                       "fetch of partition " + std::to_string(partition_id) + " from " + endpoint_ +
                           ": arena bytes have crc32c " + std::to_string(crc) +
                           ", the reply declares " + std::to_string(a.crc32c));
  return out;
}

msg::StatsReply OffloadClient::stats() {
  return expect<msg::StatsReply>(call(msg::Stats{}), "stats");
}

msg::CheckpointReply OffloadClient::checkpoint(const std::string& tag, const std::string& path) {
  return expect<msg::CheckpointReply>(call(msg::Checkpoint{tag, path}), "checkpoint");
}

msg::RestoreReply OffloadClient::restore(const std::string& tag, const std::string& path) {
  return expect<msg::RestoreReply>(call(msg::Restore{tag, path}), "restore");
}

}  // namespace dsactor::actors
