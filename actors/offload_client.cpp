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
  const uint64_t id = next_id_++;
  msg::Header header{id, job_id_, std::move(body)};
  std::vector<zmq::message_t> frames;
  if (!msg::has_payload(header.body)) {
    frames = msg::encode(header);
  } else if (owner) {
    frames = msg::encode(header, payload, std::move(owner));
  } else {
    frames = msg::encode_copy(header, payload);
  }
  zmq::send_multipart(socket_, msg::with_envelope({}, std::move(frames)));

  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (left.count() <= 0 || zmq::poll(&item, 1, left) == 0) {
      throw OffloadTimeout("offload service at " + endpoint_ + " did not answer " +
                           std::string(msg::kind_name(header.body)) + " (request " +
                           std::to_string(id) + ") within " + std::to_string(timeout_.count()) +
                           " ms");
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
    // Replies to earlier requests that timed out, or the gateway's answers to a request
    // it could not read (id 0) while we wait for a newer one: skip them.
    const uint64_t rid = decoded->header.request_id;
    if (rid != id && !(rid == 0 && std::holds_alternative<msg::ErrorReply>(decoded->header.body))) {
      continue;
    }
    if (payload_frame && msg::has_payload(decoded->header.body) && env->body.size() == 2) {
      // The decoded payload views reply's last frame; hand the frame itself over.
      *payload_frame = std::move(reply.back());
    }
    return std::move(decoded->header);
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
