#include "actors/offload_client.h"

#include <zmq_addon.hpp>

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

OffloadClient::~OffloadClient() = default;

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
  outstanding_.erase(request_id);
  arrived_.erase(request_id);
}

msg::Header OffloadClient::receive(uint64_t id, zmq::message_t* payload_frame) {
  auto take = [&](Reply& r) {
    if (payload_frame && r.payload.size() > 0) *payload_frame = std::move(r.payload);
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
      outstanding_.erase(waiting);  // a reply that still comes is discarded
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
    if (!mine && !other) continue;  // a late reply to a request that timed out: skip it
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
      call(msg::PushGradients{partition_id, step, micro_step, dtype, n}, grads, std::move(owner)),
      "pushGradients");
}

uint64_t OffloadClient::send_push_gradients(uint64_t partition_id, uint64_t step,
                                            uint32_t micro_step, msg::DType dtype,
                                            std::span<const std::byte> grads,
                                            std::shared_ptr<const void> owner) {
  const uint64_t n = grads.size() / msg::dtype_size(dtype);
  return send(msg::PushGradients{partition_id, step, micro_step, dtype, n}, grads,
              std::move(owner));
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
  out.reply = expect<msg::FetchReply>(
      call(msg::FetchParameters{partition_id, min_version, dtype}, {}, nullptr, &out.frame),
      "fetchParameters");
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
