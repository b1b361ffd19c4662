// libFuzzer target for the rendezvous store's request parser and job table
// (actors/collectives/rendezvous_protocol.h, rendezvous_jobs.h): any byte string, split into
// 1-16 frames (fuzz_input.h), must parse to a request or a refusal, never crash, hang, leak or
// trip UBSan. A request that parses is within its limits, survives encode -> parse unchanged,
// and applied to a small job table never takes it past its quotas. Bit 7 of byte 0 parses
// with tight limits.

#include <cstdio>
#include <cstdlib>

#include "actors/collectives/rendezvous_jobs.h"
#include "actors/collectives/rendezvous_protocol.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace dsactor::actors::rendezvous;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fuzz_rendezvous invariant broken: %s\n", what);
  std::abort();
}

bool same(const Request& a, const Request& b) {
  return a.id == b.id && a.op == b.op && a.job == b.job && a.token == b.token && a.keys == b.keys &&
         a.value == b.value && a.delta == b.delta && a.timeout_ms == b.timeout_ms &&
         a.world_size == b.world_size;
}

void check_limits(const Request& r, const RequestLimits& l) {
  if (r.id.size() > l.max_id_bytes) die("id beyond its limit");
  if (r.job.empty() || r.job.size() > l.max_job_bytes) die("job beyond its limit");
  if (r.token.size() > l.max_token_bytes) die("token beyond its limit");
  if (r.keys.empty() || r.keys.size() > l.max_keys_per_wait) die("key count beyond its limit");
  for (const auto& k : r.keys)
    if (k.empty() || k.size() > l.max_key_bytes) die("key beyond its limit");
  if (r.value.size() > l.max_value_bytes) die("value beyond its limit");
  if (r.timeout_ms > static_cast<uint64_t>(l.max_wait.count())) die("timeout not clamped");
  if (r.op == Op::kJoin && (r.world_size == 0 || r.world_size > l.max_world_size))
    die("world size out of range");
}

// A small table: the request, applied as the server would, keeps every quota.
void apply(const Request& r) {
  static JobTable table(JobLimits{4, 8, 512, 1024, std::chrono::milliseconds(0)}, std::nullopt);
  const auto now = Clock::now();
  if (table.admit(r.job, r.token, now, [](const std::string&) { return false; })) return;
  switch (r.op) {
    case Op::kSet:
      (void)table.set(r.job, r.keys[0], r.value);
      break;
    case Op::kAdd:
      (void)table.add(r.job, r.keys[0], r.delta);
      break;
    case Op::kDel:
      (void)table.remove(r.job, r.keys[0]);
      break;
    case Op::kJoin:
      (void)table.join(r.job, r.keys[0], r.world_size);
      break;
    case Op::kGet:
    case Op::kWait:
      (void)table.first_missing(r.job, r.keys);
      break;
  }
  if (table.jobs() > 4) die("more jobs than max_jobs");
  if (table.bytes() > 1024) die("more bytes than max_total_bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto frames = dsactor::fuzz::split_frames(data, size, 16);
  RequestLimits limits;
  if (size > 0 && (data[0] & 0x80)) {
    limits.max_id_bytes = 8;
    limits.max_job_bytes = 8;
    limits.max_token_bytes = 32;
    limits.max_key_bytes = 16;
    limits.max_value_bytes = 64;
    limits.max_keys_per_wait = 4;
    limits.max_world_size = 16;
    limits.max_wait = std::chrono::milliseconds(1000);
  }
  const Parsed p = parse_request(frames, limits);
  if (!p.request) {
    if (p.error.empty()) die("refusal without a reason");
    return 0;
  }
  if (!p.id || *p.id != p.request->id) die("request without its id");
  check_limits(*p.request, limits);
  const auto again = parse_request(encode_request(*p.request), limits);
  if (!again.request) die("an encoded request does not parse");
  if (!same(*again.request, *p.request)) die("encode -> parse changed the request");
  apply(*p.request);
  return 0;
}
