#pragma once
// What the tests of in-place pushes share: a partition as an fp32 trainer registers it, a
// push from an arena slot the test writes as the trainer's backward would, and bytes kept
// for comparing after the slot or reply they came in is gone.

#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "actors/offload_link/offload_client.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {

// What an fp32 trainer registers: served as fp32.
inline messages::PartitionSpec fp32_spec(uint64_t id, uint64_t n) {
  messages::PartitionSpec s = spec(id, n);
  s.served_dtype = messages::DType::fp32;
  return s;
}

// Registers `specs` for `c`'s job (step 0, one rank) and gives each partition the same seeded
// random parameters, so two jobs set up from the same specs start equal.
inline void register_with_seeded_parameters(actors::OffloadClient& c,
                                            const std::vector<messages::PartitionSpec>& specs) {
  c.register_partitions(0, 1, specs);
  for (const auto& p : specs)
    c.set_parameters(p.partition_id, 0, messages::DType::fp32,
                     bytes_of(random_floats(p.element_count, 7 + p.partition_id)));
}

inline std::vector<std::byte> owned_bytes(std::span<const std::byte> b) {
  return {b.begin(), b.end()};
}

// Pushes `g` from a fresh arena slot of `c`, written in place (no crc); `keep`: asks the
// service to keep the slot until the commit (PushGradients.keepUntilCommit); `stats`: sent as
// the gradient's (PushGradients.givenStats).
inline actors::LentPush push_from_slot(actors::OffloadClient& c, uint64_t pid, uint64_t step,
                                       uint32_t micro, const std::vector<float>& g, bool keep,
                                       std::optional<messages::PushedStats> stats = std::nullopt) {
  actors::ArenaBuffer slot = c.arena_buffer(g.size() * 4);
  EXPECT_TRUE(slot) << "no free arena slot";
  std::memcpy(slot.bytes().data(), g.data(), g.size() * 4);
  auto r = c.await_push(c.send_push_gradients(pid, step, micro, messages::DType::fp32, g.size(),
                                              std::move(slot), keep, stats));
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r.value()) : actors::LentPush{};
}

}  // namespace dsactor::offload::test
