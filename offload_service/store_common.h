#pragma once

// What the offload store's actors (step coordinator, partition workers, nvme_io,
// metadata) share: the refusal that becomes an ErrorReply, dtype and optimizer helpers,
// the manifest encoding of a partition spec, RAM charges, the request envelope that
// carries a reply path through the actors, and the blocking call helpers that detached
// actors use to talk to each other. Internal to offload_service/.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/cast.h"
#include "messages/codec.h"
#include "messages/shm_arena.h"
#include "offload_service/partition_store.h"

namespace dsactor::offload::detail {

namespace msg = dsactor::messages;
namespace kc = dsactor::kernels::cpu;

// A request the store refuses; turned into an ErrorReply. Thrown only before any state
// changed.
struct Refusal : std::runtime_error {
  Refusal(msg::ErrorCode c, const std::string& m) : std::runtime_error(m), code(c) {}
  msg::ErrorCode code;
};
[[noreturn]] void refuse(msg::ErrorCode code, const std::string& message);

inline bool is_half(msg::DType d) {
  return d != msg::DType::fp32;
}
inline kc::HalfKind half_kind(msg::DType d) {
  return d == msg::DType::fp16 ? kc::HalfKind::kFP16 : kc::HalfKind::kBF16;
}
std::string fmt_bytes(uint64_t b);

// Payload bytes (fp32 or half) -> floats [first, first + count) into out.
void payload_to_floats(float* out, std::span<const std::byte> payload, msg::DType dtype,
                       uint64_t first, uint64_t count);
kc::AdamHyper hyper(const msg::OptimizerConfig& o, double lr);

// The job manifest's entry of a partition, and back (tier and adam_steps aside).
nlohmann::json spec_json(const msg::PartitionSpec& s, bool on_nvme, int64_t adam_steps);
msg::PartitionSpec spec_from_json(const nlohmann::json& pj);
// A spec's fields must be in range (Register and Restore alike).
void check_spec(const msg::PartitionSpec& s);

// RAM a partition is charged: master, m, v, the gradient and the served half copy on the
// RAM tier; nothing on the NVMe tier, whose partitions stream through the staging buffers.
uint64_t ram_need(const msg::PartitionSpec& s, bool on_nvme);
// master + m + v (what max_in_cpu counts).
uint64_t opt_bytes(const msg::PartitionSpec& s);

// One request travelling through the actors: the decoded message, whatever keeps its
// bytes alive (the gateway's Request, or nothing for a caller that blocks until the
// reply), and where the reply goes. Whoever answers calls respond exactly once.
struct Incoming {
  const msg::Message* message = nullptr;
  // The sender's key (Z85) as the gateway's ZAP handler admitted it; "" for an --insecure
  // client or an in-process caller. A job belongs to the key that registered it.
  std::string peer;
  std::shared_ptr<const void> keep;
  std::function<void(Reply)> respond;
  // The mapped arena the request's arena slice names (the coordinator resolved it and
  // checked the slice lies inside); held until the request is answered, so an UnmapArena
  // meanwhile cannot pull the pages from under it.
  std::shared_ptr<const messages::ArenaMapping> arena;

  const msg::Header& header() const { return message->header; }
  void error(msg::ErrorCode code, const std::string& text) const;
};
using IncomingPtr = std::shared_ptr<const Incoming>;

// Runs `body` and answers an Incoming with its reply, or the ErrorReply of a refusal or
// an exception (logged, and counted as an error of the answering actor's `figures` when
// it has them); never throws.
void answer(const Incoming& in, metrics::ActorFigures* figures, const std::function<Reply()>& body);

// A blocking request from a detached actor (or a plain thread) to a typed actor: the
// callers are detached, so waiting here stalls only their own thread. Throws
// std::runtime_error when the actor is gone.
template <class R, class Handle, class... Ts>
R call(caf::actor_system& system, const Handle& to, Ts&&... xs) {
  caf::scoped_actor self{system};
  std::optional<R> out;
  caf::error err;
  self->request(to, caf::infinite, std::forward<Ts>(xs)...)
      .receive([&](R& r) { out = std::move(r); }, [&](caf::error& e) { err = std::move(e); });
  if (!out) throw std::runtime_error("offload: actor request failed: " + system.render(err));
  return std::move(*out);
}

// The same request to several actors at once (they run in parallel), gathered in order.
template <class R, class Handle, class MakeArgs>
std::vector<R> call_all(caf::actor_system& system, const std::vector<Handle>& to,
                        MakeArgs&& make_args) {
  caf::scoped_actor self{system};
  std::vector<std::optional<R>> out(to.size());
  caf::error err;
  using H = decltype(std::apply(
      [&](auto&&... xs) { return self->request(to[0], caf::infinite, xs...); }, make_args(0)));
  std::vector<H> pending;
  for (size_t i = 0; i < to.size(); ++i) {
    pending.push_back(std::apply(
        [&](auto&&... xs) { return self->request(to[i], caf::infinite, xs...); }, make_args(i)));
  }
  for (size_t i = 0; i < to.size(); ++i) {
    pending[i].receive([&](R& r) { out[i] = std::move(r); },
                       [&](caf::error& e) { err = std::move(e); });
  }
  std::vector<R> result;
  for (auto& o : out) {
    if (!o) throw std::runtime_error("offload: actor request failed: " + system.render(err));
    result.push_back(std::move(*o));
  }
  return result;
}

}  // namespace dsactor::offload::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::detail::IncomingPtr)
