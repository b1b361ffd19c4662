// Checkpoint and Restore stay beneath the service's state directory, in the directory of
// the requesting key and job, and a checkpoint is restored only by the job that wrote it,
// unchanged. Replayed against a real keyed service: absolute paths (the old `path` field
// and an absolute name), "..", symlinks that lead out, reading another run's tag, restoring
// another job's checkpoint, overwriting another run's checkpoint, and checkpoints changed on
// disk (the manifest, or the tensors with their crc32c fixed up so only the MAC can tell).
// Every refusal leaves the victim's weights bit-identical; nothing appears outside the
// state directory; what the service persists is 0600 / 0700.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "checksum/crc32c.h"
#include "tests/security/offload_attack_util.h"

namespace dsactor::offload::test {
namespace {

namespace fs = std::filesystem;
namespace msg = dsactor::messages;
using actors::OffloadError;
using msg::ErrorCode;

class OffloadCheckpointPaths : public OffloadAttack {
 protected:
  void SetUp() override {
    state_ = tmp_.path / "state";
    outside_ = tmp_.path / "outside";
    fs::create_directories(outside_);
    start({"--state-dir", state_.string()});
    victim_->checkpoint("victim-secret-tag", "run/ck");
    victim_ckpt_ = checkpoint_location(state_, service_->client_security().keys.public_key,
                                       kVictimJob, "run/ck");
    ASSERT_TRUE(fs::exists(victim_ckpt_ / "manifest.json")) << victim_ckpt_;
  }

  // The refusal of `request` by `c`: its code and words.
  static msg::ErrorReply refusal(actors::OffloadClient& c, msg::Body request) {
    const msg::Header h = c.call(std::move(request));
    const auto* e = std::get_if<msg::ErrorReply>(&h.body);
    EXPECT_NE(e, nullptr) << "answered " << msg::kind_name(h.body);
    return e ? *e : msg::ErrorReply{};
  }

  std::string file_text(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path state_, outside_, victim_ckpt_;
};

TEST_F(OffloadCheckpointPaths, PathsOutOfTheJobsDirectoryAreRefused) {
  const fs::path target = outside_ / "planted";
  for (const auto& [what, body] : std::vector<std::pair<std::string, msg::Body>>{
           {"old path field", msg::Checkpoint{"t", target.string(), ""}},
           {"absolute name", msg::Checkpoint{"t", "", target.string()}},
           {"dot-dot", msg::Checkpoint{"t", "", "../../../../outside/planted"}},
           {"dot-dot inside", msg::Checkpoint{"t", "", "a/../../planted"}},
           {"empty", msg::Checkpoint{"t", "", ""}},
           {"restore old path", msg::Restore{"t", victim_ckpt_.string(), ""}},
           {"restore absolute", msg::Restore{"t", "", victim_ckpt_.string()}},
       }) {
    SCOPED_TRACE(what);
    EXPECT_EQ(refusal(*victim_, body).code, ErrorCode::malformed);
  }
  // A symlink in the job's directory that leads out: neither written through nor read.
  const fs::path job_dir = victim_ckpt_.parent_path().parent_path();
  fs::create_directory_symlink(outside_, job_dir / "exit");
  fs::create_directory_symlink(victim_ckpt_.parent_path() / "ck", outside_ / "ck-link");
  auto e = refusal(*victim_, msg::Checkpoint{"t", "", "exit/planted"});
  EXPECT_EQ(e.code, ErrorCode::malformed);
  EXPECT_NE(e.message.find("leads out"), std::string::npos) << e.message;
  EXPECT_EQ(refusal(*victim_, msg::Checkpoint{"t", "", "exit"}).code, ErrorCode::malformed);
  EXPECT_EQ(refusal(*victim_, msg::Restore{"victim-secret-tag", "", "exit/ck-link"}).code,
            ErrorCode::malformed);
  EXPECT_FALSE(fs::exists(outside_ / "planted"));
  EXPECT_FALSE(fs::exists(tmp_.path / "planted"));
  expect_victim_untouched();
}

TEST_F(OffloadCheckpointPaths, AnotherClientCannotReadRestoreOrOverwriteTheVictimsCheckpoint) {
  const std::string manifest = file_text(victim_ckpt_ / "manifest.json");
  const std::string tensors = file_text(victim_ckpt_ / "tensors.bin");
  // The stranger's job of the same name is the victim's: denied outright.
  auto same_job = client(stranger(), kVictimJob);
  EXPECT_EQ(refusal(*same_job, msg::Restore{"x", "", "run/ck"}).code, ErrorCode::permissionDenied);
  EXPECT_EQ(refusal(*same_job, msg::Checkpoint{"x", "", "run/ck"}).code,
            ErrorCode::permissionDenied);
  // Its own job: names resolve in its own directory, so the victim's are out of reach, and
  // no refusal tells the victim's tag.
  auto own = client(stranger(), "attacker");
  own->register_partitions(0, 1, {spec(kVictimPartition, kVictimElements)});
  const std::string victim_owner = owner_dir_name(service_->client_security().keys.public_key);
  for (const std::string& name :
       {std::string("run/ck"), "../" + std::string(kVictimJob) + "/run/ck",
        "../../" + victim_owner + "/" + kVictimJob + "/run/ck"}) {
    SCOPED_TRACE(name);
    for (const std::string& tag : {std::string("victim-secret-tag"), std::string("guess")}) {
      const auto e = refusal(*own, msg::Restore{tag, "", name});
      EXPECT_EQ(e.code, ErrorCode::malformed) << e.message;
      EXPECT_EQ(e.message.find("victim-secret-tag"), std::string::npos) << e.message;
    }
    if (name != "run/ck") {
      EXPECT_EQ(refusal(*own, msg::Checkpoint{"poison", "", name}).code, ErrorCode::malformed);
    }
  }
  // The same name is the stranger's own checkpoint, elsewhere.
  const auto mine = own->checkpoint("poison", "run/ck");
  EXPECT_NE(fs::path(mine.location), victim_ckpt_);
  // Copied into the stranger's directory by someone with the files (a shared disk), the
  // victim's checkpoint is refused by its MAC: it is another job's.
  const fs::path copy = checkpoint_location(state_, keys_.stranger.public_key, "attacker", "copy");
  fs::copy(victim_ckpt_, copy);
  const auto e = refusal(*own, msg::Restore{"victim-secret-tag", "", "copy"});
  EXPECT_EQ(e.code, ErrorCode::permissionDenied) << e.message;
  EXPECT_NE(e.message.find("manifest.json"), std::string::npos) << e.message;
  // The victim's checkpoint is as it was, and restores.
  EXPECT_EQ(file_text(victim_ckpt_ / "manifest.json"), manifest);
  EXPECT_EQ(file_text(victim_ckpt_ / "tensors.bin"), tensors);
  EXPECT_EQ(victim_->restore("victim-secret-tag", "run/ck").step, 1u);
  expect_victim_untouched();
}

// DeleteCheckpoint (what --keep-last sends) reaches only the requester's own checkpoints:
// the victim's job is denied to a stranger, the stranger's own names resolve in its own
// directory, and nothing out of the job's directory is deleted.
TEST_F(OffloadCheckpointPaths, DeleteCheckpointReachesOnlyTheRequestersOwnCheckpoints) {
  fs::create_directories(outside_ / "keep");
  std::ofstream(outside_ / "keep/manifest.json") << "{}";
  std::ofstream(outside_ / "keep/tensors.bin") << "x";
  auto same_job = client(stranger(), kVictimJob);
  EXPECT_EQ(refusal(*same_job, msg::DeleteCheckpoint{"run/ck"}).code, ErrorCode::permissionDenied);
  auto own = client(stranger(), "attacker");
  own->register_partitions(0, 1, {spec(kVictimPartition, kVictimElements)});
  const std::string victim_owner = owner_dir_name(service_->client_security().keys.public_key);
  for (const std::string& name :
       {std::string("run/ck"), "../" + std::string(kVictimJob) + "/run/ck",
        "../../" + victim_owner + "/" + kVictimJob + "/run/ck", outside_.string() + "/keep",
        std::string("../../../../outside/keep")}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(refusal(*own, msg::DeleteCheckpoint{name}).code, ErrorCode::malformed);
  }
  // A symlink to a checkpoint is not deleted through (nor is its target).
  const fs::path job_dir = victim_ckpt_.parent_path().parent_path();
  fs::create_directory_symlink(outside_ / "keep", job_dir / "link");
  EXPECT_EQ(refusal(*victim_, msg::DeleteCheckpoint{"link"}).code, ErrorCode::malformed);
  EXPECT_TRUE(fs::exists(outside_ / "keep/tensors.bin"));
  EXPECT_TRUE(fs::exists(victim_ckpt_ / "tensors.bin"));
  // The stranger's own checkpoint of the same name goes; the victim's stays.
  own->checkpoint("mine", "run/ck");
  EXPECT_GT(own->delete_checkpoint("run/ck").bytes_freed, 0u);
  EXPECT_TRUE(fs::exists(victim_ckpt_ / "tensors.bin"));
  // The owner deletes its own: gone, with the directory it leaves empty.
  EXPECT_GT(victim_->delete_checkpoint("run/ck").bytes_freed, 0u);
  EXPECT_FALSE(fs::exists(victim_ckpt_));
  EXPECT_FALSE(fs::exists(victim_ckpt_.parent_path()));
  EXPECT_EQ(refusal(*victim_, msg::DeleteCheckpoint{"run/ck"}).code, ErrorCode::malformed);
  expect_victim_untouched();
}

TEST_F(OffloadCheckpointPaths, AChangedCheckpointIsRefusedNamingTheFile) {
  // The manifest's state changed (a learning rate of 1e30 planted in it).
  fs::copy(victim_ckpt_, victim_ckpt_.parent_path() / "lr", fs::copy_options::recursive);
  const fs::path lr = victim_ckpt_.parent_path() / "lr" / "manifest.json";
  auto m = nlohmann::json::parse(file_text(lr));
  m.at("state").at("partitions").at(0)["lr"] = 1e30;
  std::ofstream(lr, std::ios::binary | std::ios::trunc) << m.dump(1);
  auto e = refusal(*victim_, msg::Restore{"victim-secret-tag", "", "run/lr"});
  EXPECT_EQ(e.code, ErrorCode::permissionDenied) << e.message;
  EXPECT_NE(e.message.find("manifest.json"), std::string::npos) << e.message;

  // The tensors changed, their crc32c in the manifest's tensor list fixed up to match: only
  // the MAC can tell.
  fs::copy(victim_ckpt_, victim_ckpt_.parent_path() / "bits", fs::copy_options::recursive);
  const fs::path dir = victim_ckpt_.parent_path() / "bits";
  auto manifest = nlohmann::json::parse(file_text(dir / "manifest.json"));
  std::string bin = file_text(dir / "tensors.bin");
  auto& t = manifest.at("tensors").at(0);  // partition 1's master
  const uint64_t off = t.at("offset").get<uint64_t>(), bytes = t.at("bytes").get<uint64_t>();
  bin[off + 8] ^= 0x40;
  t["crc32c"] = checksum::crc32c(bin.data() + off, bytes);
  std::ofstream(dir / "tensors.bin", std::ios::binary | std::ios::trunc) << bin;
  std::ofstream(dir / "manifest.json", std::ios::binary | std::ios::trunc) << manifest.dump(1);
  e = refusal(*victim_, msg::Restore{"victim-secret-tag", "", "run/bits"});
  EXPECT_EQ(e.code, ErrorCode::permissionDenied) << e.message;
  EXPECT_NE(e.message.find("tensors.bin"), std::string::npos) << e.message;
  expect_victim_untouched();
}

TEST_F(OffloadCheckpointPaths, WhatTheServicePersistsIsItsUsersOnly) {
  const auto nvme = tmp_.path / "nvme";
  ServiceProcess svc({"--nvme", nvme.string()}, tmp_.path);
  auto c =
      std::make_unique<actors::OffloadClient>(svc.endpoint(), svc.client_security(), 10s, "modes");
  c->register_partitions(0, 1, {spec(1, 4096)});
  c->checkpoint("m", "ck");
  size_t seen = 0;
  for (const fs::path& root : {state_, nvme}) {
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      struct stat st {};
      ASSERT_EQ(::lstat(e.path().c_str(), &st), 0);
      if (S_ISLNK(st.st_mode)) continue;
      const unsigned mode = st.st_mode & 0777;
      if (S_ISDIR(st.st_mode))
        EXPECT_EQ(mode, 0700u) << e.path();
      else
        EXPECT_EQ(mode & 077, 0u) << e.path() << " mode " << std::oct << mode;
      ++seen;
    }
  }
  EXPECT_GT(seen, 8u);
  struct stat st {};
  ASSERT_EQ(::stat((state_ / "checkpoint-mac.secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

}  // namespace
}  // namespace dsactor::offload::test
