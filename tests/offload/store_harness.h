#pragma once

// An in-process PartitionStore driven request by request (no network), and a job trained
// on it against the trainer-side reference (RefPartition): setup (Register +
// SetParameters), a step of two micro-steps, and a check of every partition's fp32 and
// bf16 copies. Shared by the tier and scale tests.

#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/adam.h"
#include "offload_service/partition_store.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {

struct Harness {
  PartitionStore& store;
  std::string job = "job";
  uint64_t next = 1;

  Reply call(messages::Body body, std::span<const std::byte> payload = {}) {
    messages::Message m{{next++, job, std::move(body)}, payload, 0, false, {}};
    return store.handle(m);
  }
  template <class T>
  T ok(messages::Body body, std::span<const std::byte> payload = {}) {
    Reply r = call(std::move(body), payload);
    if (auto* e = std::get_if<messages::ErrorReply>(&r.header.body)) {
      ADD_FAILURE() << "error reply: " << messages::to_string(e->code) << ": " << e->message;
      return T{};
    }
    return std::get<T>(r.header.body);
  }
  messages::ErrorReply err(messages::Body body, std::span<const std::byte> payload = {}) {
    Reply r = call(std::move(body), payload);
    EXPECT_TRUE(r.is_error());
    return r.is_error() ? std::get<messages::ErrorReply>(r.header.body) : messages::ErrorReply{};
  }
  std::vector<std::byte> fetch(uint64_t pid, messages::DType d = messages::DType::fp32,
                               uint64_t min_version = 0) {
    Reply r = call(messages::FetchParameters{pid, min_version, d, {}});
    EXPECT_FALSE(r.is_error());
    return {r.payload.begin(), r.payload.end()};
  }
};

inline std::vector<RefPartition> setup(Harness& h, std::vector<messages::PartitionSpec> specs) {
  h.ok<messages::RegisterReply>(messages::Register{0, 1, specs});
  std::vector<RefPartition> ref;
  for (auto& s : specs) {
    ref.emplace_back(s, random_floats(s.element_count, 3 + s.partition_id));
    h.ok<messages::SetParametersReply>(
        messages::SetParameters{s.partition_id, 0, messages::DType::fp32, s.element_count},
        bytes_of(ref.back().master));
  }
  return ref;
}

inline void step(Harness& h, std::vector<RefPartition>& ref, uint64_t s, uint32_t seed) {
  for (int k = 0; k < 2; ++k) {
    for (auto& p : ref) {
      auto g = random_floats(p.master.size(), seed++, 64.0f);
      p.accumulate(g, k == 0);
      const auto r = h.ok<messages::PushReply>(
          messages::PushGradients{
              p.spec.partition_id, s, uint32_t(k), messages::DType::fp32, g.size(), {}},
          bytes_of(g));
      // The accumulated gradient's sum of squares, bit for bit the trainer's.
      EXPECT_EQ(r.sum_squares, kernels::cpu::grad_stats(p.grad.data(), p.grad.size()).sum_squares)
          << "partition " << p.spec.partition_id << " step " << s << " micro-step " << k;
    }
  }
  const messages::CommitStep c{s, 0.5, 64.0, 1e-3};
  h.ok<messages::CommitReply>(c);
  for (auto& p : ref) p.step(c.clip_coef, c.loss_scale, c.lr);
}

inline void check(Harness& h, const std::vector<RefPartition>& ref, const char* what) {
  for (auto& p : ref) {
    expect_bits_equal(p.master, h.fetch(p.spec.partition_id), what);
    expect_bf16_equal(p.master, h.fetch(p.spec.partition_id, messages::DType::bf16), what);
  }
}

}  // namespace dsactor::offload::test
