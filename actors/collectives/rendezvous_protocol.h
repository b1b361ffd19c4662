#pragma once
// The rendezvous store's wire format, private to the store's server and client (and the
// fuzz target that checks its parser). DEALER -> ROUTER, one multipart message per request,
// every number a little-endian u64:
//
//   request: [request id][op][job][job token][args...]
//     set:  [key][value]            get:  [timeout ms][key]     wait: [timeout ms][key]...
//     add:  [key][delta]            del:  [key]
//     join: [group][world size]     (the join protocol: the reply is this process's rank)
//   reply:   [request id][status][payload]   status "ok", "timeout" or "error"
//
// parse_request never throws and never trusts a length: every frame is checked against
// RequestLimits before anything is copied out of it.

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

namespace dsactor::actors::rendezvous {

// The longest a get/wait may be parked, whatever it asks for (a client asking for more is
// clamped to this, so no deadline can overflow the clock).
inline constexpr std::chrono::milliseconds kMaxWait = std::chrono::hours(24);

enum class Op { kSet, kGet, kWait, kAdd, kDel, kJoin };
std::string_view op_name(Op op);

struct RequestLimits {
  size_t max_id_bytes = 64;
  size_t max_job_bytes = 128;
  size_t max_token_bytes = 256;
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = size_t{1} << 20;
  size_t max_keys_per_wait = 4096;
  uint64_t max_world_size = uint64_t{1} << 20;
  std::chrono::milliseconds max_wait = kMaxWait;
};

struct Request {
  std::string id;
  Op op = Op::kSet;
  std::string job;
  std::string token;
  // set/add/del/get: one key; wait: one or more; join: the group (a job may hold several).
  std::vector<std::string> keys;
  std::string value;        // set
  int64_t delta = 0;        // add
  uint64_t timeout_ms = 0;  // get/wait, at most limits.max_wait
  uint64_t world_size = 0;  // join, 1..limits.max_world_size
};

// A parsed request, or why not. `id` is set whenever the first frame could be an id, so a
// refusal can be answered; without it the request is dropped.
struct Parsed {
  std::optional<Request> request;
  std::optional<std::string> id;
  std::string error;
};

// frames: everything after the ROUTER's identity frame.
Parsed parse_request(std::span<const zmq::message_t> frames, const RequestLimits& limits = {});
// The frames of `request` (no identity): what the client sends.
std::vector<zmq::message_t> encode_request(const Request& request);

std::string encode_u64(uint64_t v);
std::optional<uint64_t> decode_u64(std::string_view bytes);  // exactly 8 bytes

}  // namespace dsactor::actors::rendezvous
