#include "actors/collectives/rendezvous_protocol.h"

#include <algorithm>

namespace dsactor::actors::rendezvous {

namespace {

std::string_view view(const zmq::message_t& m) {
  return {m.data<char>(), m.size()};
}

std::optional<Op> op_of(std::string_view name) {
  for (const Op op : {Op::kSet, Op::kGet, Op::kWait, Op::kAdd, Op::kDel, Op::kJoin})
    if (op_name(op) == name) return op;
  return std::nullopt;
}

// The argument frames each op takes: exactly, or at least (wait).
struct Arity {
  size_t min, max;
};
Arity arity(Op op) {
  switch (op) {
    case Op::kSet:
    case Op::kGet:
    case Op::kAdd:
    case Op::kJoin:
      return {2, 2};
    case Op::kDel:
      return {1, 1};
    case Op::kWait:
      break;
  }
  return {2, SIZE_MAX};
}

class Parser {
 public:
  Parser(std::span<const zmq::message_t> frames, const RequestLimits& limits)
      : frames_(frames), limits_(limits) {}

  Parsed run() {
    Parsed out;
    if (frames_.empty()) return fail(out, "empty request");
    if (frames_[0].size() > limits_.max_id_bytes) return fail(out, "request id too long");
    out.id = std::string(view(frames_[0]));
    if (frames_.size() < 4) return fail(out, "expected [id][op][job][token][args...]");
    const auto op = op_of(view(frames_[1]));
    if (!op) return fail(out, "unknown request");
    Request r;
    r.id = *out.id;
    r.op = *op;
    if (frames_[2].size() == 0 || frames_[2].size() > limits_.max_job_bytes)
      return fail(out, "job id empty or longer than " + std::to_string(limits_.max_job_bytes));
    r.job = std::string(view(frames_[2]));
    if (frames_[3].size() > limits_.max_token_bytes) return fail(out, "job token too long");
    r.token = std::string(view(frames_[3]));
    const auto args = frames_.subspan(4);
    const Arity a = arity(r.op);
    if (args.size() < a.min || args.size() > a.max)
      return fail(
          out, std::string(op_name(r.op)) + " with " + std::to_string(args.size()) + " arguments");
    if (const char* why = read_args(r, args)) return fail(out, why);
    out.request = std::move(r);
    return out;
  }

 private:
  static Parsed& fail(Parsed& p, std::string why) {
    p.error = std::move(why);
    return p;
  }

  const char* key(std::string& into, const zmq::message_t& m) const {
    if (m.size() == 0 || m.size() > limits_.max_key_bytes) return "key empty or too long";
    into = std::string(view(m));
    return nullptr;
  }

  const char* read_args(Request& r, std::span<const zmq::message_t> args) const {
    switch (r.op) {
      case Op::kSet:
        if (args[1].size() > limits_.max_value_bytes) return "value too large";
        r.value = std::string(view(args[1]));
        break;
      case Op::kGet:
      case Op::kWait: {
        const auto ms = decode_u64(view(args[0]));
        if (!ms) return "malformed timeout";
        r.timeout_ms = std::min<uint64_t>(*ms, static_cast<uint64_t>(limits_.max_wait.count()));
        if (args.size() - 1 > limits_.max_keys_per_wait) return "too many keys in one wait";
        r.keys.resize(args.size() - 1);
        for (size_t i = 1; i < args.size(); ++i)
          if (const char* why = key(r.keys[i - 1], args[i])) return why;
        return nullptr;
      }
      case Op::kAdd: {
        const auto delta = decode_u64(view(args[1]));
        if (!delta) return "malformed delta";
        r.delta = static_cast<int64_t>(*delta);
        break;
      }
      case Op::kJoin: {
        const auto world = decode_u64(view(args[1]));
        if (!world || *world == 0 || *world > limits_.max_world_size)
          return "world size missing or out of range";
        r.world_size = *world;
        break;
      }
      case Op::kDel:
        break;
    }
    r.keys.resize(1);
    return key(r.keys[0], args[0]);
  }

  std::span<const zmq::message_t> frames_;
  const RequestLimits& limits_;
};

}  // namespace

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kSet:
      return "set";
    case Op::kGet:
      return "get";
    case Op::kWait:
      return "wait";
    case Op::kAdd:
      return "add";
    case Op::kDel:
      return "del";
    case Op::kJoin:
      break;
  }
  return "join";
}

Parsed parse_request(std::span<const zmq::message_t> frames, const RequestLimits& limits) {
  return Parser(frames, limits).run();
}

std::vector<zmq::message_t> encode_request(const Request& r) {
  std::vector<std::string> f = {r.id, std::string(op_name(r.op)), r.job, r.token};
  switch (r.op) {
    case Op::kSet:
      f.insert(f.end(), {r.keys.at(0), r.value});
      break;
    case Op::kGet:
    case Op::kWait:
      f.push_back(encode_u64(r.timeout_ms));
      f.insert(f.end(), r.keys.begin(), r.keys.end());
      break;
    case Op::kAdd:
      f.insert(f.end(), {r.keys.at(0), encode_u64(static_cast<uint64_t>(r.delta))});
      break;
    case Op::kDel:
      f.push_back(r.keys.at(0));
      break;
    case Op::kJoin:
      f.insert(f.end(), {r.keys.at(0), encode_u64(r.world_size)});
      break;
  }
  std::vector<zmq::message_t> out;
  out.reserve(f.size());
  for (const auto& s : f) out.emplace_back(s.data(), s.size());
  return out;
}

std::string encode_u64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

std::optional<uint64_t> decode_u64(std::string_view bytes) {
  if (bytes.size() != 8) return std::nullopt;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  return v;
}

}  // namespace dsactor::actors::rendezvous
