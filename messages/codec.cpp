// The codec's names and shapes (kind names, error texts, which kinds carry a payload) and
// the ROUTER/DEALER envelopes. decode() is in codec_decode.cpp, encode() in codec_encode.cpp.
#include "messages/codec.h"

#include <iterator>
#include <string>

namespace dsactor::messages {

std::string_view to_string(DType d) {
  switch (d) {
    case DType::fp32:
      return "fp32";
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
  }
  return "invalid";
}

std::string_view to_string(ErrorCode c) {
  switch (c) {
    case ErrorCode::malformed:
      return "malformed";
    case ErrorCode::unknownPartition:
      return "unknownPartition";
    case ErrorCode::versionOrder:
      return "versionOrder";
    case ErrorCode::checksumMismatch:
      return "checksumMismatch";
    case ErrorCode::tooLarge:
      return "tooLarge";
    case ErrorCode::outOfMemory:
      return "outOfMemory";
    case ErrorCode::notImplemented:
      return "notImplemented";
    case ErrorCode::internal:
      return "internal";
    case ErrorCode::schemaMismatch:
      return "schemaMismatch";
    case ErrorCode::permissionDenied:
      return "permissionDenied";
    case ErrorCode::busy:
      return "busy";
  }
  return "invalid";
}

std::string_view to_string(DecodeErrc c) {
  switch (c) {
    case DecodeErrc::wrongFrameCount:
      return "wrongFrameCount";
    case DecodeErrc::badHeader:
      return "badHeader";
    case DecodeErrc::schemaMismatch:
      return "schemaMismatch";
    case DecodeErrc::unknownKind:
      return "unknownKind";
    case DecodeErrc::tooLarge:
      return "tooLarge";
    case DecodeErrc::lengthMismatch:
      return "lengthMismatch";
    case DecodeErrc::badDtype:
      return "badDtype";
    case DecodeErrc::badField:
      return "badField";
    case DecodeErrc::checksumMismatch:
      return "checksumMismatch";
  }
  return "invalid";
}

ErrorCode reply_code(DecodeErrc c) {
  switch (c) {
    case DecodeErrc::tooLarge:
      return ErrorCode::tooLarge;
    case DecodeErrc::checksumMismatch:
      return ErrorCode::checksumMismatch;
    case DecodeErrc::schemaMismatch:
      return ErrorCode::schemaMismatch;
    case DecodeErrc::unknownKind:
      return ErrorCode::notImplemented;
    default:
      return ErrorCode::malformed;
  }
}

std::string_view kind_name(const Body& body) {
  static constexpr std::string_view kNames[] = {"register",
                                                "registerReply",
                                                "setParameters",
                                                "setParametersReply",
                                                "pushGradients",
                                                "pushReply",
                                                "commitStep",
                                                "skipStep",
                                                "commitReply",
                                                "fetchParameters",
                                                "fetchReply",
                                                "stats",
                                                "statsReply",
                                                "checkpoint",
                                                "checkpointReply",
                                                "restore",
                                                "restoreReply",
                                                "ping",
                                                "pong",
                                                "errorReply",
                                                "mapArena",
                                                "mapArenaReply",
                                                "unmapArena",
                                                "unmapArenaReply",
                                                "dropJob",
                                                "dropJobReply",
                                                "deleteCheckpoint",
                                                "deleteCheckpointReply"};
  static_assert(std::size(kNames) == std::variant_size_v<Body>);
  return body.valueless_by_exception() ? "valueless" : kNames[body.index()];
}

std::optional<std::pair<DType, uint64_t>> payload_shape(const Body& body) {
  if (const auto* b = std::get_if<SetParameters>(&body))
    return std::pair{b->dtype, b->element_count};
  // With an arena slice the bytes are in shared memory: no frame 1.
  if (const auto* b = std::get_if<PushGradients>(&body); b && !b->arena)
    return std::pair{b->dtype, b->payload_count()};
  // Nor with a master view: the bytes are the service's own, mapped by the requester.
  if (const auto* b = std::get_if<FetchReply>(&body); b && !b->arena && !b->master_view)
    return std::pair{b->dtype, b->payload_count()};
  return std::nullopt;
}

const ArenaSlice* arena_of(const Body& body) {
  if (const auto* b = std::get_if<PushGradients>(&body)) return b->arena ? &*b->arena : nullptr;
  if (const auto* b = std::get_if<FetchParameters>(&body)) return b->arena ? &*b->arena : nullptr;
  if (const auto* b = std::get_if<FetchReply>(&body)) return b->arena ? &*b->arena : nullptr;
  return nullptr;
}

bool has_payload(const Body& body) {
  return payload_shape(body).has_value();
}

Header error_reply(uint64_t request_id, std::string job_id, const DecodeError& error) {
  return Header{request_id, std::move(job_id),
                ErrorReply{reply_code(error.code),
                           std::string(to_string(error.code)) + ": " + error.message}};
}

// ---- envelopes ------------------------------------------------------------------------

Result<Envelope> split_envelope(std::span<const zmq::message_t> frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    if (frames[i].size() == 0) return Envelope{frames.first(i), frames.subspan(i + 1)};
  }
  return DecodeError{DecodeErrc::wrongFrameCount,
                     "no empty delimiter frame in " + std::to_string(frames.size()) + " frames"};
}

std::vector<zmq::message_t> with_envelope(std::span<const zmq::message_t> routing,
                                          std::vector<zmq::message_t> body) {
  std::vector<zmq::message_t> out;
  out.reserve(routing.size() + 1 + body.size());
  // Byte copies: identities are a few bytes, and zmq_msg_copy would mutate the source
  // (it turns it refcounted), which a const span must not do behind the caller's back.
  for (const zmq::message_t& r : routing) out.emplace_back(r.data(), r.size());
  out.emplace_back();
  for (zmq::message_t& b : body) out.push_back(std::move(b));
  return out;
}

}  // namespace dsactor::messages
