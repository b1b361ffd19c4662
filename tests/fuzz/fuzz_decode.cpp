// libFuzzer target for the wire decoder: any byte string, split into 1-3 frames, must
// decode to a message or a DecodeError, never crash, hang, leak or trip UBSan. A message
// that decodes must survive encode -> decode unchanged (byte-identical re-encoding), so
// the decoder never accepts something the encoder could not have produced.

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "messages/codec.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace dsactor::messages;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fuzz_decode invariant broken: %s\n", what);
  std::abort();
}

std::vector<zmq::message_t> reencode(const Message& m) {
  if (!has_payload(m.header.body)) return encode(m.header);
  if (m.payload_parts.empty()) return encode_copy(m.header, m.payload, m.payload_crc32c);
  // A fetch reply's parts are how its bytes travelled: joined, they re-encode as one frame.
  std::vector<std::byte> joined;
  for (std::span<const std::byte> part : m.payload_parts)
    joined.insert(joined.end(), part.begin(), part.end());
  return encode_copy(m.header, joined, m.payload_crc32c);
}

bool same_bytes(const zmq::message_t& a, const zmq::message_t& b) {
  return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

void check(std::span<const zmq::message_t> frames, const Limits& limits) {
  auto r = decode(frames, limits);
  if (!r.ok()) {
    if (r.error().message.empty()) die("error without message");
    (void)error_reply(0, "", r.error());
    return;
  }
  const Message& m = r.value();
  if (!has_payload(m.header.body) && (!m.payload.empty() || !m.payload_parts.empty()))
    die("payload on a kind without one");
  if (!m.payload_parts.empty() && !std::holds_alternative<FetchReply>(m.header.body))
    die("payload parts on a kind other than fetchReply");
  // An arena slice that decodes names an arena and a range a receiver can add up safely
  // (it still checks the range against its mapping), and replaces frame 1.
  if (const ArenaSlice* a = arena_of(m.header.body)) {
    if (a->arena_id == 0) die("arena slice with id 0");
    if (a->offset > UINT64_MAX - a->length) die("arena slice wraps around");
    if (a->length > limits.max_payload_bytes) die("arena slice above max_payload_bytes");
    if (frames.size() != 1) die("arena slice with a payload frame");
  }
  std::vector<zmq::message_t> once;
  try {
    once = reencode(m);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    die("encode refused a decoded message");
  }
  // Default limits here: the canonical re-encoding may legitimately be larger than the
  // input (capnp lets a sender shrink struct-list elements), so tight limits may not fit.
  auto again = decode(once, Limits{});
  if (!again.ok()) {
    std::fprintf(stderr, "%s\n", again.error().message.c_str());
    die("re-encoded message does not decode");
  }
  auto twice = reencode(again.value());
  if (once.size() != twice.size()) die("frame count changed");
  for (size_t i = 0; i < once.size(); ++i)
    if (!same_bytes(once[i], twice[i])) die("re-encoding is not stable");
  if (kind_name(m.header.body) != kind_name(again->header.body)) die("kind changed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto frames = dsactor::fuzz::split_frames(data, size);
  check(frames, Limits{});
  if (size > 0 && (data[0] & 0x80)) {
    Limits tight;
    tight.max_payload_bytes = 256;
    tight.max_header_bytes = 512;
    tight.traversal_limit_words = 64;
    tight.nesting_limit = 3;
    tight.max_text_bytes = 16;
    tight.max_list_items = 4;
    check(frames, tight);
  }
  // The envelope splitter sees the same frames as a ROUTER would.
  auto env = split_envelope(frames);
  if (env.ok()) check(env->body, Limits{});
  return 0;
}
