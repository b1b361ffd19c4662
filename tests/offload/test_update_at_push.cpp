// The optimizer step run on the push (PushGradients.updateAtPush, the ds_config's
// offload_optimizer.update_at_push) against a real `dsactor start --role offload` process: a
// job whose pushes ask for it and a job whose commits run the update, the same partitions,
// gradients and steps, serve the same bytes after every commit, whichever way the gradient
// came (in place, a frame, in ranges, holding a -0). A step partly applied this
// way can only be committed: fetches, second pushes, skips and a commit with another lr are
// refused, naming why, and the step still commits afterwards; a new session gets no record
// to resume it from, and a checkpoint restored replaces it.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "actors/offload_link/offload_client.h"
#include "checksum/crc32c.h"
#include "tests/offload/arena_push_util.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using actors::OffloadClient;
using msg::DType;
using namespace std::chrono_literals;

using UpdateAtPush = SharedServiceTest;

// Pushes `g` from an arena slot, written in place as the trainer's backward does.
msg::PushReply push_in_place(OffloadClient& c, uint64_t pid, uint64_t step,
                             const std::vector<float>& g) {
  return push_from_slot(c, pid, step, 0, g, false).reply;
}

msg::FetchParameters fp32_fetch(uint64_t pid, uint64_t min_version) {
  msg::FetchParameters f;
  f.partition_id = pid;
  f.min_version = min_version;
  f.dtype = DType::fp32;
  return f;
}

struct TwoJobs {
  TwoJobs(deploy::ServiceProcess& svc, const std::string& name, std::vector<msg::PartitionSpec> s)
      : updating(svc.endpoint(), svc.client_security(), 10s, name + "-updating"),
        at_commit(svc.endpoint(), svc.client_security(), 10s, name + "-at-commit"),
        specs(std::move(s)) {
    uint64_t largest = 0;
    for (const auto& p : specs) largest = std::max(largest, p.element_count);
    for (OffloadClient* c : {&updating, &at_commit}) {
      EXPECT_TRUE(c->map_arena(largest * 4, specs.size() + 1));
      register_with_seeded_parameters(*c, specs);
    }
  }
  void expect_same_parameters(uint64_t step) {
    for (const auto& p : specs) {
      const auto want = at_commit.fetch(p.partition_id, step, DType::fp32);
      const auto got = updating.fetch(p.partition_id, step, DType::fp32);
      EXPECT_EQ(owned_bytes(got.bytes()), owned_bytes(want.bytes()))
          << "partition " << p.partition_id << " step " << step;
    }
  }
  OffloadClient updating, at_commit;
  std::vector<msg::PartitionSpec> specs;
};

msg::CommitStep commit_of(uint64_t step, double lr) {
  msg::CommitStep c{step, 1.0, 1.0, lr};
  c.publish_before_reply = true;
  return c;
}

// In place from a slot, as a frame, in ranges, and with a -0 in it: each push updated its
// partition, and after each commit the parameters equal the job whose commit ran Adam.
TEST_F(UpdateAtPush, EqualsTheUpdateAtTheCommitBitForBit) {
  TwoJobs jobs(*svc_, "equal",
               {fp32_spec(1, 70000), fp32_spec(2, 4097), fp32_spec(3, 5000), fp32_spec(4, 3000)});
  uint32_t seed = 90;
  for (uint64_t step = 1; step <= 3; ++step) {
    const double lr = 1e-3 * static_cast<double>(step);
    jobs.updating.set_update_at_push(lr);
    std::vector<std::vector<float>> g;
    for (const auto& p : jobs.specs) g.push_back(random_floats(p.element_count, seed++, 4.0f));
    g[3][17] = -0.0f;  // 0 + -0 is +0 in a sum: this one goes through it first
    // Partition 3 in ranges of 1 KiB (the last range runs the update), the others whole.
    jobs.updating.set_push_range_bytes(0);
    jobs.at_commit.set_push_range_bytes(0);
    std::vector<msg::PushReply> updated, plain;
    updated.push_back(push_in_place(jobs.updating, 1, step, g[0]));
    plain.push_back(push_in_place(jobs.at_commit, 1, step, g[0]));
    updated.push_back(jobs.updating.push_gradients(2, step, 0, DType::fp32, bytes_of(g[1])));
    plain.push_back(jobs.at_commit.push_gradients(2, step, 0, DType::fp32, bytes_of(g[1])));
    jobs.updating.set_push_range_bytes(1024);
    updated.push_back(jobs.updating.push_gradients(3, step, 0, DType::fp32, bytes_of(g[2])));
    jobs.updating.set_push_range_bytes(0);
    plain.push_back(jobs.at_commit.push_gradients(3, step, 0, DType::fp32, bytes_of(g[2])));
    updated.push_back(push_in_place(jobs.updating, 4, step, g[3]));
    plain.push_back(push_in_place(jobs.at_commit, 4, step, g[3]));
    for (size_t i = 0; i < updated.size(); ++i) {
      SCOPED_TRACE("partition " + std::to_string(i + 1) + " step " + std::to_string(step));
      EXPECT_TRUE(updated[i].updated) << "the update ran on the push";
      EXPECT_FALSE(plain[i].updated);
      EXPECT_EQ(updated[i].sum_squares, plain[i].sum_squares);
      EXPECT_FALSE(updated[i].nonfinite);
    }
    jobs.updating.commit(commit_of(step, lr));
    jobs.at_commit.commit(commit_of(step, lr));
    jobs.expect_same_parameters(step);
  }
}

// A gradient holding an inf or a nan is applied as any other (the stats come from the same
// pass) and reported as nonfinite: in fp32 the trainer's verdict then ends the run, and the
// step, partly applied, cannot be skipped.
TEST_F(UpdateAtPush, ANonfiniteGradientIsReportedAndTheStepCannotBeSkipped) {
  TwoJobs jobs(*svc_, "nonfinite", {fp32_spec(1, 3000), fp32_spec(2, 2000)});
  jobs.updating.set_update_at_push(1e-3);
  auto g1 = random_floats(3000, 5);
  g1[100] = std::numeric_limits<float>::infinity();
  auto g2 = random_floats(2000, 6);
  g2[3] = std::numeric_limits<float>::quiet_NaN();
  const msg::PushReply a = push_in_place(jobs.updating, 1, 1, g1);
  const msg::PushReply b = jobs.updating.push_gradients(2, 1, 0, DType::fp32, bytes_of(g2));
  EXPECT_TRUE(a.nonfinite);
  EXPECT_TRUE(b.nonfinite);
  EXPECT_TRUE(a.updated);
  EXPECT_TRUE(b.updated);
  const msg::Header skip = jobs.updating.call(msg::SkipStep{1});
  const auto* e = std::get_if<msg::ErrorReply>(&skip.body);
  ASSERT_NE(e, nullptr);
  EXPECT_NE(e->message.find("2 partition(s)"), std::string::npos) << e->message;
}

// A push asking for the update whose bytes fail their crc is refused before anything is
// updated: the partition takes the same step's push afterwards and ends as the other job's.
TEST_F(UpdateAtPush, ABadCrcUpdatesNothing) {
  TwoJobs jobs(*svc_, "crc", {fp32_spec(1, 3000)});
  const auto g = random_floats(3000, 31);
  actors::ArenaBuffer slot = jobs.updating.arena_buffer(3000 * 4);
  ASSERT_TRUE(slot);
  std::memcpy(slot.bytes().data(), g.data(), g.size() * 4);
  const uint32_t crc = checksum::crc32c(slot.bytes().data(), 3000 * 4);
  msg::PushGradients push{
      1,    1,
      0,    DType::fp32,
      3000, msg::ArenaSlice{jobs.updating.arena_id(), slot.offset(), 3000 * 4, crc ^ 1u, false}};
  push.update_at_push = true;
  push.update_lr = 1e-3;
  const msg::Header refused = jobs.updating.call(push);
  const auto* e = std::get_if<msg::ErrorReply>(&refused.body);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->code, msg::ErrorCode::checksumMismatch) << e->message;
  slot = {};
  // Nothing was updated: the partition is served, and the step goes on.
  EXPECT_EQ(owned_bytes(jobs.updating.fetch(1, 0, DType::fp32).bytes()),
            owned_bytes(jobs.at_commit.fetch(1, 0, DType::fp32).bytes()));
  jobs.updating.set_update_at_push(1e-3);
  ASSERT_TRUE(push_in_place(jobs.updating, 1, 1, g).updated);
  push_in_place(jobs.at_commit, 1, 1, g);
  jobs.updating.commit(commit_of(1, 1e-3));
  jobs.at_commit.commit(commit_of(1, 1e-3));
  jobs.expect_same_parameters(1);
}

std::string refusal(OffloadClient& c, msg::Body body, std::span<const std::byte> payload = {}) {
  const msg::Header r = c.call(std::move(body), payload);
  const auto* e = std::get_if<msg::ErrorReply>(&r.body);
  if (!e) return "(not refused)";
  EXPECT_EQ(e->code, msg::ErrorCode::versionOrder) << e->message;
  return e->message;
}

TEST_F(UpdateAtPush, APartlyAppliedStepCanOnlyBeCommitted) {
  TwoJobs jobs(*svc_, "partly", {fp32_spec(1, 3000), fp32_spec(2, 2000)});
  jobs.updating.set_update_at_push(2e-3);
  const auto g1 = random_floats(3000, 11), g2 = random_floats(2000, 12);
  ASSERT_TRUE(push_in_place(jobs.updating, 1, 1, g1).updated);
  // Partition 1 holds step 1's update already; partition 2 has no gradient yet.
  EXPECT_NE(refusal(jobs.updating, fp32_fetch(1, 0)).find("updated at its push of step 1"),
            std::string::npos);
  const std::vector<float> again(3000, 1.0f);
  EXPECT_NE(
      refusal(jobs.updating, msg::PushGradients{1, 1, 0, DType::fp32, 3000, {}}, bytes_of(again))
          .find("takes no other push"),
      std::string::npos);
  EXPECT_NE(refusal(jobs.updating, msg::SkipStep{1})
                .find("skip: step 1 is partly applied: 1 partition(s) (first 1)"),
            std::string::npos);
  // The other partition is served as it was, and takes its push.
  EXPECT_EQ(owned_bytes(jobs.updating.fetch(2, 0, DType::fp32).bytes()),
            owned_bytes(jobs.at_commit.fetch(2, 0, DType::fp32).bytes()));
  ASSERT_TRUE(jobs.updating.push_gradients(2, 1, 0, DType::fp32, bytes_of(g2)).updated);
  // A commit with another lr than the pushes' is refused for what it cannot change.
  const msg::Header other = jobs.updating.call(commit_of(1, 3e-3));
  const auto* e = std::get_if<msg::ErrorReply>(&other.body);
  ASSERT_NE(e, nullptr);
  EXPECT_NE(e->message.find("was updated at its push with lr"), std::string::npos) << e->message;
  // The step commits with its own lr and equals the job whose commit ran the update.
  push_in_place(jobs.at_commit, 1, 1, g1);
  jobs.at_commit.push_gradients(2, 1, 0, DType::fp32, bytes_of(g2));
  msg::CommitStep commit = commit_of(1, 2e-3);
  commit.resume_record = "after step 1";
  jobs.updating.commit(commit);
  jobs.at_commit.commit(commit_of(1, 2e-3));
  jobs.expect_same_parameters(1);
  jobs.updating.checkpoint("step-1", "update-at-push-step-1");
  const auto step1 = owned_bytes(jobs.updating.fetch(1, 1, DType::fp32).bytes());
  auto resume = [&] {
    const msg::Header r = jobs.updating.call(msg::Register{0, 1, jobs.specs, true});
    const auto* reply = std::get_if<msg::RegisterReply>(&r.body);
    EXPECT_NE(reply, nullptr);
    return reply ? reply->resume_record : std::string("(refused)");
  };
  // Committed, a new session continues from the step and its record.
  EXPECT_EQ(resume(), "after step 1");
  // A session gone after a push of step 2 updated partition 1: the next one gets no record
  // to continue from (it restores a checkpoint or starts over), and partition 1 serves
  // nothing of the partly applied step until then.
  jobs.updating.set_update_at_push(1e-3);
  ASSERT_TRUE(push_in_place(jobs.updating, 1, 2, random_floats(3000, 13)).updated);
  EXPECT_EQ(resume(), "");
  EXPECT_NE(refusal(jobs.updating, fp32_fetch(1, 1)).find("updated at its push of step 2"),
            std::string::npos);
  EXPECT_NE(refusal(jobs.updating, msg::Checkpoint{"half", "", "update-at-push-half"})
                .find("holds part of step 2"),
            std::string::npos);
  jobs.updating.restore("step-1", "update-at-push-step-1");
  EXPECT_EQ(owned_bytes(jobs.updating.fetch(1, 1, DType::fp32).bytes()), step1);
  // The same again, then a fresh start: SetParameters replaces the partition's state.
  ASSERT_TRUE(push_in_place(jobs.updating, 1, 2, random_floats(3000, 14)).updated);
  EXPECT_EQ(resume(), "");
  EXPECT_NE(refusal(jobs.updating, fp32_fetch(1, 1)).find("step 2"), std::string::npos);
  const auto fresh = random_floats(3000, 15);
  jobs.updating.set_parameters(1, 1, DType::fp32, bytes_of(fresh));
  EXPECT_EQ(owned_bytes(jobs.updating.fetch(1, 1, DType::fp32).bytes()),
            owned_bytes(bytes_of(fresh)));
}

}  // namespace
}  // namespace dsactor::offload::test
