// A push slot lent to the service until the commit (PushGradients.keepUntilCommit) against a
// real `dsactor start --role offload` process: the service keeps a whole fp32 micro-step-0
// gradient where the trainer wrote it, answers with the same stats a copied push gets, and
// a commit answered after the update leaves the partition's updated parameters in the slot,
// bit for bit what a fetch serves and what a job whose pushes were copied gets. Everything
// the service cannot keep exactly (a crc to check, a -0, a half-precision copy to serve, a
// later micro-step, a commit answered before its update, a skip) takes the copying path
// with the same results.

#include <gtest/gtest.h>

#include <cstring>

#include "actors/offload_link/offload_client.h"
#include "kernels/cpu/adam.h"
#include "tests/offload/arena_push_util.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using actors::LentPush;
using actors::OffloadClient;
using msg::DType;
using namespace std::chrono_literals;

using KeptGradient = SharedServiceTest;

// Pushes `g` from a fresh arena slot, written in place (no crc), asking the service to keep it.
LentPush push_lending(OffloadClient& c, uint64_t pid, uint64_t step, uint32_t micro,
                      const std::vector<float>& g) {
  return push_from_slot(c, pid, step, micro, g, true);
}

// A job that lends its slots and one whose pushes are copied (frames), the same partitions,
// gradients and commits: the kept job's replies, slots and fetches equal the other's.
struct TwoJobs {
  TwoJobs(deploy::ServiceProcess& svc, const std::string& name, std::vector<msg::PartitionSpec> s)
      : lending(svc.endpoint(), svc.client_security(), 10s, name + "-lending"),
        copied(svc.endpoint(), svc.client_security(), 10s, name + "-copied"),
        specs(std::move(s)) {
    uint64_t largest = 0;
    for (const auto& p : specs) largest = std::max(largest, p.element_count);
    EXPECT_TRUE(lending.map_arena(largest * 4, 2 * specs.size() + 1));
    for (OffloadClient* c : {&lending, &copied}) register_with_seeded_parameters(*c, specs);
  }
  OffloadClient lending, copied;
  std::vector<msg::PartitionSpec> specs;
};

TEST_F(KeptGradient, CommitAfterTheUpdateLeavesTheParametersInTheSlot) {
  TwoJobs jobs(*svc_, "after-update", {fp32_spec(1, 300000), fp32_spec(2, 4097)});
  uint32_t seed = 50;
  for (uint64_t step = 1; step <= 3; ++step) {
    std::vector<LentPush> lent;
    for (const auto& p : jobs.specs) {
      const auto g = random_floats(p.element_count, seed++, 8.0f);
      LentPush kept = push_lending(jobs.lending, p.partition_id, step, 0, g);
      const msg::PushReply copied =
          jobs.copied.push_gradients(p.partition_id, step, 0, DType::fp32, bytes_of(g));
      EXPECT_TRUE(kept.reply.kept) << "partition " << p.partition_id;
      ASSERT_TRUE(kept.lent) << "a kept push gives its slot back to the caller";
      EXPECT_FALSE(copied.kept);
      EXPECT_EQ(kept.reply.sum_squares, copied.sum_squares);
      EXPECT_EQ(kept.reply.nonfinite, copied.nonfinite);
      lent.push_back(std::move(kept));
    }
    msg::CommitStep commit{step, 0.5, 1.0, 1e-3};
    commit.publish_before_reply = true;
    const msg::CommitReply a = jobs.lending.commit(commit);
    const msg::CommitReply b = jobs.copied.commit(commit);
    EXPECT_TRUE(a.kept_hold_parameters);
    for (size_t i = 0; i < jobs.specs.size(); ++i) {
      const uint64_t pid = jobs.specs[i].partition_id;
      const auto want = jobs.copied.fetch(pid, step, DType::fp32);
      const size_t bytes = jobs.specs[i].element_count * 4;
      EXPECT_EQ(owned_bytes(lent[i].lent.bytes().first(bytes)), owned_bytes(want.bytes()))
          << "partition " << pid << " step " << step << ": the slot holds the update";
      lent[i] = {};  // the slot is the trainer's again: free it before the fetch below
      const auto served = jobs.lending.fetch(pid, step, DType::fp32);
      EXPECT_EQ(owned_bytes(served.bytes()), owned_bytes(want.bytes())) << "partition " << pid;
    }
  }
}

// Answered once decided, the update is published behind the reply, partition by partition;
// DSACTOR_TEST_PAUSE_AT holds each update back 1.5 s, so on any machine the kept partition
// (the second) is updated long after the reply, when the trainer has already written over
// its slot. The service must have copied the gradient out before the reply.
TEST(KeptGradientBehindReply, CommitBeforeTheUpdateCopiesTheGradientOutFirst) {
  TempDir tmp;
  deploy::ServiceProcess svc(DSACTOR_BINARY, one_worker_pausing_updates(tmp.path, 1500));
  TwoJobs jobs(svc, "behind-reply", {fp32_spec(1, 4096), fp32_spec(2, 70000)});
  const auto g1 = random_floats(4096, 2, 2.0f), g2 = random_floats(70000, 3, 2.0f);
  for (OffloadClient* c : {&jobs.lending, &jobs.copied})
    c->push_gradients(1, 1, 0, DType::fp32, bytes_of(g1));
  LentPush kept = push_lending(jobs.lending, 2, 1, 0, g2);
  ASSERT_TRUE(kept.reply.kept);
  jobs.copied.push_gradients(2, 1, 0, DType::fp32, bytes_of(g2));
  const msg::CommitStep commit{1, 1.0, 1.0, 1e-3};  // answered once decided
  EXPECT_FALSE(jobs.lending.commit(commit).kept_hold_parameters);
  // The slot is the trainer's at the reply: what it writes there now must not reach the
  // update of partition 2, still 1.5 s away.
  std::memset(kept.lent.bytes().data(), 0x7f, kept.lent.bytes().size());
  jobs.copied.commit(commit);
  for (uint64_t pid : {1, 2})
    EXPECT_EQ(owned_bytes(jobs.lending.fetch(pid, 1, DType::fp32).bytes()),
              owned_bytes(jobs.copied.fetch(pid, 1, DType::fp32).bytes()))
        << "partition " << pid;
  EXPECT_EQ(svc.stop(), 0);
}

TEST_F(KeptGradient, WhatCannotBeKeptExactlyIsCopiedAsAnyPush) {
  // Served as bf16: the update writes the half copy, so no fp32 parameters go to the slot.
  TwoJobs jobs(*svc_, "not-kept", {fp32_spec(1, 5000), spec(2, 5000), fp32_spec(3, 5000)});
  auto g = random_floats(5000, 9);
  g[17] = -0.0f;  // 0 + -0 is +0 in the copied sum: kept, Adam would read the -0
  std::vector<LentPush> lent;
  lent.push_back(push_lending(jobs.lending, 1, 1, 0, g));
  lent.push_back(push_lending(jobs.lending, 2, 1, 0, random_floats(5000, 10)));
  // A later micro-step adds into the sum: the kept micro-step 0 is copied into it first.
  lent.push_back(push_lending(jobs.lending, 3, 1, 0, random_floats(5000, 11)));
  EXPECT_FALSE(lent[0].reply.kept) << "a -0 in the gradient";
  EXPECT_FALSE(lent[0].lent);
  EXPECT_FALSE(lent[1].reply.kept) << "served as bf16";
  EXPECT_TRUE(lent[2].reply.kept);
  const auto g3 = random_floats(5000, 12);
  LentPush later = push_lending(jobs.lending, 3, 1, 1, g3);
  EXPECT_FALSE(later.reply.kept) << "micro-step 1";
  // A crc to check: the copy checks it.
  jobs.lending.set_arena_checksums(true);
  jobs.copied.push_gradients(1, 1, 0, DType::fp32, bytes_of(g));
  jobs.copied.push_gradients(2, 1, 0, DType::fp32, bytes_of(random_floats(5000, 10)));
  jobs.copied.push_gradients(3, 1, 0, DType::fp32, bytes_of(random_floats(5000, 11)));
  jobs.copied.push_gradients(3, 1, 1, DType::fp32, bytes_of(g3));
  msg::CommitStep commit{1, 1.0, 1.0, 1e-3};
  commit.publish_before_reply = true;
  jobs.lending.commit(commit);
  jobs.copied.commit(commit);
  // The kept micro-step 0 of partition 3 is not the update's: the slot keeps the gradient.
  const auto g3_first = random_floats(5000, 11);
  EXPECT_EQ(owned_bytes(lent[2].lent.bytes().first(5000 * 4)), owned_bytes(bytes_of(g3_first)));
  lent.clear();
  for (uint64_t pid : {1, 2, 3})
    for (DType dt : {DType::fp32, DType::bf16})
      EXPECT_EQ(owned_bytes(jobs.lending.fetch(pid, 1, dt).bytes()),
                owned_bytes(jobs.copied.fetch(pid, 1, dt).bytes()))
          << "partition " << pid;
  // With checksums on, the service checks the crc instead of keeping the slot.
  const auto g2 = random_floats(5000, 13);
  actors::ArenaBuffer slot = jobs.lending.arena_buffer(g2.size() * 4);
  ASSERT_TRUE(slot);
  std::memcpy(slot.bytes().data(), g2.data(), g2.size() * 4);
  auto with_crc = jobs.lending.await_push(
      jobs.lending.send_push_gradients(1, 2, 0, DType::fp32, g2.size(), std::move(slot), true));
  ASSERT_TRUE(with_crc.ok());
  EXPECT_FALSE(with_crc->reply.kept) << "a crc to check";
}

// A trainer that gives its gradient's stats with a lent push (PushGradients.givenStats) is
// answered with them when the service keeps the slot: the service reads the gradient only in
// the commit's Adam pass, whose update is still bit for bit the copied job's. Stats that are
// not the gradient's come back as given, which shows that nothing read it before the commit
// (they spoil only the norm of the job that sent them). A push the service copies (a crc to
// check, a half copy served) is answered with the service's own stats, the given ones unused.
TEST_F(KeptGradient, AKeptPushIsAnsweredWithTheStatsTheTrainerGave) {
  TwoJobs jobs(*svc_, "given-stats", {fp32_spec(1, 300000), fp32_spec(2, 5000), spec(3, 5000)});
  const auto g1 = random_floats(300000, 30, 4.0f);
  const auto g2 = random_floats(5000, 31);
  const auto g3 = random_floats(5000, 32);
  const kernels::cpu::GradStats true1 = kernels::cpu::grad_stats(g1.data(), g1.size());
  const kernels::cpu::GradStats true2 = kernels::cpu::grad_stats(g2.data(), g2.size());
  const kernels::cpu::GradStats true3 = kernels::cpu::grad_stats(g3.data(), g3.size());
  LentPush honest = push_from_slot(jobs.lending, 1, 1, 0, g1, true,
                                   msg::PushedStats{true1.sum_squares, true1.nonfinite});
  const msg::PushedStats made_up{12345.5, false};
  LentPush unread = push_from_slot(jobs.lending, 2, 1, 0, g2, true, made_up);
  LentPush half = push_from_slot(jobs.lending, 3, 1, 0, g3, true, made_up);
  ASSERT_TRUE(honest.reply.kept);
  ASSERT_TRUE(unread.reply.kept);
  ASSERT_NE(true2.sum_squares, made_up.sum_squares);
  EXPECT_EQ(honest.reply.sum_squares, true1.sum_squares);
  EXPECT_EQ(unread.reply.sum_squares, made_up.sum_squares) << "the given stats, unread";
  EXPECT_FALSE(half.reply.kept) << "served as bf16";
  EXPECT_EQ(half.reply.sum_squares, true3.sum_squares) << "the service's own stats";
  for (const auto& [pid, g] : {std::pair{1, &g1}, std::pair{2, &g2}, std::pair{3, &g3}})
    jobs.copied.push_gradients(pid, 1, 0, DType::fp32, bytes_of(*g));
  msg::CommitStep commit{1, 0.5, 1.0, 1e-3};
  commit.publish_before_reply = true;
  EXPECT_TRUE(jobs.lending.commit(commit).kept_hold_parameters);
  jobs.copied.commit(commit);
  for (auto [pid, lent] : {std::pair{1, &honest}, std::pair{2, &unread}}) {
    const auto want = jobs.copied.fetch(pid, 1, DType::fp32);
    EXPECT_EQ(owned_bytes(lent->lent.bytes().first(want.bytes().size())), owned_bytes(want.bytes()))
        << "partition " << pid << ": the update read the gradient in the slot";
    *lent = {};
  }
  // With checksums on the service checks the crc, copying the gradient: its own stats.
  jobs.lending.set_arena_checksums(true);
  const auto g4 = random_floats(5000, 33);
  const LentPush checked = push_from_slot(jobs.lending, 2, 2, 0, g4, true, made_up);
  EXPECT_FALSE(checked.reply.kept) << "a crc to check";
  EXPECT_EQ(checked.reply.sum_squares, kernels::cpu::grad_stats(g4.data(), g4.size()).sum_squares);
}

TEST_F(KeptGradient, ASkipLetsTheSlotGoAndTheNextStepStartsOver) {
  TwoJobs jobs(*svc_, "skip", {fp32_spec(1, 9000)});
  LentPush kept = push_lending(jobs.lending, 1, 1, 0, random_floats(9000, 20));
  ASSERT_TRUE(kept.reply.kept);
  jobs.copied.push_gradients(1, 1, 0, DType::fp32, bytes_of(random_floats(9000, 20)));
  EXPECT_FALSE(jobs.lending.skip(1).applied);
  jobs.copied.skip(1);
  // What the trainer writes into its slot after the skip is nobody's gradient.
  std::memset(kept.lent.bytes().data(), 0x41, kept.lent.bytes().size());
  kept = {};
  const auto g = random_floats(9000, 21);
  LentPush next = push_lending(jobs.lending, 1, 2, 0, g);
  EXPECT_TRUE(next.reply.kept);
  jobs.copied.push_gradients(1, 2, 0, DType::fp32, bytes_of(g));
  msg::CommitStep commit{2, 1.0, 1.0, 1e-3};
  commit.publish_before_reply = true;
  EXPECT_TRUE(jobs.lending.commit(commit).kept_hold_parameters);
  jobs.copied.commit(commit);
  const auto want = jobs.copied.fetch(1, 2, DType::fp32);
  EXPECT_EQ(owned_bytes(next.lent.bytes().first(9000 * 4)), owned_bytes(want.bytes()));
}

}  // namespace
}  // namespace dsactor::offload::test
