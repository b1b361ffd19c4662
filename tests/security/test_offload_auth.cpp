// The offload service's authentication and job ownership, replayed as an attacker would on
// 127.0.0.1: a second connection with no key, with a key the service does not admit, and
// with another client's admitted key tries to fetch the victim's weights, overwrite them
// with SetParameters, push and commit a step, register, checkpoint, restore, map an arena
// and drop the job. Without an admitted key nothing reaches the service (every request
// times out); with another client's key every request on the job is "permission denied",
// and the refusal is the same whether a partition exists or not. The victim's weights are
// bit-identical afterwards and it trains on. Also: --insecure works on loopback with its
// warning and is refused on 0.0.0.0, and a service without keys does not start.

#include <gtest/gtest.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "deploy/child_process.h"
#include "deploy/file_watch.h"
#include "tests/security/offload_attack_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using actors::OffloadClient;
using actors::OffloadError;
using actors::OffloadTimeout;
using msg::DType;
using msg::ErrorCode;

// Every request an attacker would send on the victim's job.
std::vector<msg::Body> attacks() {
  const msg::ArenaSlice slice{1, 0, 4 * kVictimElements, 0};
  return {msg::FetchParameters{kVictimPartition, 0, DType::fp32, {}},
          msg::FetchParameters{kVictimPartition, 0, DType::fp32, slice},
          msg::FetchParameters{999, 0, DType::fp32, {}},
          msg::SetParameters{kVictimPartition, 9, DType::fp32, kVictimElements},
          msg::PushGradients{kVictimPartition, 2, 0, DType::fp32, kVictimElements, {}},
          msg::CommitStep{2, 1.0, 1.0, 1e30},
          msg::SkipStep{2},
          msg::Register{0, 1, {spec(kVictimPartition, kVictimElements)}},
          msg::Register{0, 1, {spec(77, 10)}},
          msg::Checkpoint{"steal", "", "steal"},
          msg::Restore{"steal", "", "steal"},
          msg::MapArena{"", 4096, ""},
          msg::UnmapArena{1},
          msg::DropJob{}};
}

std::span<const std::byte> payload_for(const msg::Body& body, const std::vector<float>& poison) {
  return msg::has_payload(body) ? bytes_of(poison) : std::span<const std::byte>{};
}

using OffloadAuth = OffloadAttack;

TEST_F(OffloadAuth, WithoutAnAdmittedKeyNothingReachesTheService) {
  start();
  const std::vector<float> poison(kVictimElements, 1e30f);
  for (const auto& [who, security] :
       {std::pair{"no key", no_key()}, std::pair{"an unauthorized key", unauthorized()}}) {
    SCOPED_TRACE(who);
    auto attacker = client(security, kVictimJob, 200ms);
    for (const msg::Body& body : attacks()) {
      SCOPED_TRACE(std::string(msg::kind_name(body)));
      EXPECT_THROW(attacker->call(body, payload_for(body, poison)), OffloadTimeout);
    }
    EXPECT_THROW(attacker->stats(), OffloadTimeout);
  }
  // A plain DEALER's bytes do not reach the service either.
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  // Its handshake fails, so the DEALER may never have a connection to queue the message on.
  raw.set(zmq::sockopt::sndtimeo, 200);
  raw.connect(service_->endpoint());
  auto frames = msg::with_envelope(
      {}, msg::encode_copy({1, kVictimJob,
                            msg::SetParameters{kVictimPartition, 9, DType::fp32, kVictimElements}},
                           bytes_of(poison)));
  (void)zmq::send_multipart(raw, frames);
  zmq::pollitem_t item{raw.handle(), 0, ZMQ_POLLIN, 0};
  EXPECT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(200)), 0);
  EXPECT_NE(service_->log().find("refused a connection"), std::string::npos) << service_->log();
  expect_victim_untouched();
}

TEST_F(OffloadAuth, AnotherClientsKeyIsDeniedEverythingOnTheJobAndLearnsNothing) {
  start();
  const std::vector<float> poison(kVictimElements, 1e30f);
  auto attacker = client(stranger(), kVictimJob);
  std::string first_message;
  for (const msg::Body& body : attacks()) {
    SCOPED_TRACE(std::string(msg::kind_name(body)));
    const msg::Header h = attacker->call(body, payload_for(body, poison));
    const auto* e = std::get_if<msg::ErrorReply>(&h.body);
    ASSERT_NE(e, nullptr) << "answered " << msg::kind_name(h.body);
    EXPECT_EQ(e->code, ErrorCode::permissionDenied) << e->message;
    // One refusal for everything: no partition ids, steps, versions, tags or crcs.
    if (first_message.empty()) first_message = e->message;
    EXPECT_EQ(e->message, first_message);
    EXPECT_EQ(e->message.find_first_of("0123456789"), std::string::npos) << e->message;
  }
  // Stats is the service's, not a job's: it names no job.
  EXPECT_EQ(attacker->stats().partitions, 1u);
  // The stranger's own jobs are its own: a job of another name works, and the victim is
  // denied it in turn.
  auto own = client(stranger(), "stranger-job");
  own->register_partitions(0, 1, {spec(1, 16)});
  auto victim_there = client(service_->client_security(), "stranger-job");
  EXPECT_THROW(victim_there->fetch(1, 0, DType::fp32), OffloadError);
  expect_victim_untouched();
}

TEST_F(OffloadAuth, DropJobFreesTheJobForItsOwnerOnly) {
  start();
  const auto before = victim_->stats();
  EXPECT_GT(before.bytes_in_ram, 0u);
  auto attacker = client(stranger(), kVictimJob);
  EXPECT_THROW(attacker->drop_job(), OffloadError);
  EXPECT_EQ(victim_->stats().partitions, 1u);
  const auto dropped = victim_->drop_job();
  EXPECT_EQ(dropped.partitions, 1u);
  EXPECT_EQ(dropped.bytes_freed, before.bytes_in_ram);
  const auto after = victim_->stats();
  EXPECT_EQ(after.partitions, 0u);
  EXPECT_EQ(after.bytes_in_ram, 0u);
  try {
    victim_->fetch(kVictimPartition, 0, DType::fp32);
    ADD_FAILURE() << "a dropped job was served";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.code(), ErrorCode::unknownPartition) << e.what();
  }
  // The name is free again: whoever registers it next owns it.
  attacker->register_partitions(0, 1, {spec(1, 16)});
  EXPECT_THROW(victim_->fetch(1, 0, DType::fp32), OffloadError);
}

TEST_F(OffloadAuth, NvmeJobsKeepTheirOwnerAcrossARestart) {
  const auto nvme = (tmp_.path / "nvme").string();
  start({"--nvme", nvme});
  EXPECT_EQ(service_->stop(), 0);
  victim_.reset();
  service_ = std::make_unique<ServiceProcess>(std::vector<std::string>{"--nvme", nvme}, tmp_.path,
                                              tmp_.path / "keys",
                                              std::vector<std::string>{keys_.stranger.public_key});
  victim_ = client(service_->client_security(), kVictimJob);
  auto attacker = client(stranger(), kVictimJob);
  try {
    attacker->fetch(kVictimPartition, 0, DType::fp32);
    ADD_FAILURE() << "the reloaded job was served to another key";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.code(), ErrorCode::permissionDenied) << e.what();
  }
  expect_victim_untouched();
}

TEST(OffloadInsecure, WorksOnLoopbackWithAWarningAndIsRefusedElsewhere) {
  TempDir tmp;
  ServiceProcess plain({"--insecure"}, tmp.path);
  EXPECT_TRUE(plain.client_security().insecure);
  EXPECT_NE(plain.log().find("WITHOUT authentication"), std::string::npos) << plain.log();
  OffloadClient c(plain.endpoint(), plain.client_security(), 10s, "plain");
  c.register_partitions(0, 1, {spec(1, 64)});
  EXPECT_EQ(c.stats().partitions, 1u);
  // Every plain client is the same client: the job is theirs together.
  OffloadClient other(plain.endpoint(), plain.client_security(), 10s, "plain");
  EXPECT_EQ(other.fetch(1, 0, DType::fp32).reply.element_count, 64u);

  // A service that must not start: it exits non-zero, its log naming why.
  auto refused = [&](const std::string& listen, std::vector<std::string> flags,
                     const std::vector<std::string>& words) {
    std::vector<std::string> argv{
        DSACTOR_BINARY, "start", "--role",      "offload",
        "--listen",     listen,  "--state-dir", (tmp.path / "state").string()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    deploy::ChildOptions child;
    child.err = deploy::Output::to_file(tmp.path / "refused.log");
    auto proc = deploy::ChildProcess::exec(argv, child);
    const auto status = proc.wait_for(std::chrono::seconds(30));
    ASSERT_TRUE(status) << "still running: " << listen;
    EXPECT_NE(deploy::exit_code(*status), 0);
    const std::string log = deploy::read_text(tmp.path / "refused.log");
    for (const auto& w : words) EXPECT_NE(log.find(w), std::string::npos) << log;
  };
  refused("tcp://0.0.0.0:0", {"--insecure"}, {"loopback only"});
  // No keys and no --insecure: refused, saying how to make keys.
  refused("tcp://127.0.0.1:0", {}, {"--secret-key is required", "dsactor keygen"});
}

}  // namespace
}  // namespace dsactor::offload::test
