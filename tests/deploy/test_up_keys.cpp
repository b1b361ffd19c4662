// `dsactor up`'s keys end to end. A file without a `security:` block runs keyed on keys made
// for the run, in a private directory that is gone afterwards. And the README's recipe for
// several hosts, played on one machine: two deploy files (a "host" each: trainer rank 0 serving the
// rendezvous, and rank 1 meeting it) that name one security.keys_dir and one job token file, the
// keys made with `up --make-keys` from both files, then one `dsactor up` per file. The ranks meet
// only through keys: rank 0's allow-list is the key directory (every role's public key), rank 1
// names rank 0's public key as security.coordinator_key. (A rank holding a stranger's key is
// refused: tests/security/test_rendezvous_cli.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <string>

#include "tests/cli/child_process.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class UpKeys : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string corpus;
    for (int i = 0; i < 200; ++i) corpus += "the quick brown fox " + std::to_string(i % 7) + "\n";
    write_file(dir / "corpus.txt", corpus);
    write_file(dir / "ds.json", R"({"train_micro_batch_size_per_gpu": 2})");
    rendezvous = "tcp://127.0.0.1:" + std::to_string(free_port());
  }
  // One host's file: trainer `rank` of 2, and the security block `security`.
  std::filesystem::path host(const std::string& name, int rank, const std::string& security,
                             const std::string& role_extra = "") {
    const auto file = dir / (name + ".yaml");
    write_file(file, "job: two\nrendezvous: \"" + rendezvous + "\"\nsecurity: " + security +
                         "\nroles:\n  - {role: trainer, name: t" + std::to_string(rank) +
                         ", rank: " + std::to_string(rank) +
                         ", world_size: 2, config: ds.json, model: tiny, data: corpus.txt, "
                         "steps: 2, env: {DSACTOR_LOG: info}" +
                         role_extra + "}\n");
    return file;
  }
  std::unique_ptr<DsactorProcess> up(const std::filesystem::path& file,
                                     std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {"up", file.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto log = dir / (file.stem().string() + (extra.empty() ? "" : "-" + extra[0]) + ".log");
    // A run's own keys go under $XDG_RUNTIME_DIR: here, where the test can look.
    return std::make_unique<DsactorProcess>(
        args, log, log, std::vector<std::string>{"XDG_RUNTIME_DIR=" + (dir / "run").string()},
        dir.path());
  }

  TempDir dir;
  std::string rendezvous;
  const std::string shared_keys = "{keys_dir: keys, job_token_file: keys/job.token";
};

TEST_F(UpKeys, ADefaultRunIsKeyedAndLeavesNoKeysBehind) {
  std::filesystem::create_directories(dir / "run");
  const auto file = dir / "both.yaml";
  std::string roles;
  for (int r = 0; r < 2; ++r)
    roles += "  - {role: trainer, name: t" + std::to_string(r) +
             ", config: ds.json, model: tiny, data: corpus.txt, steps: 2, "
             "env: {DSACTOR_LOG: info}}\n";
  write_file(file, "job: plain\nroles:\n" + roles);
  auto run = up(file);
  EXPECT_EQ(run->wait(300s), 0) << run->out();
  const std::string keys = (dir / "run").string() + "/dsactor-keys-";
  EXPECT_THAT(run->out(), AllOf(HasSubstr("(keys in " + keys), HasSubstr("--secret-key"),
                                HasSubstr("(CurveZMQ)"), HasSubstr("rank 1 of 2 connected")));
  EXPECT_TRUE(std::filesystem::is_empty(dir / "run"));  // the run's keys went with it
}

TEST_F(UpKeys, TwoFilesSharingAKeysDirectoryTrainTogether) {
  const auto a = host("host-a", 0, shared_keys + "}", ", authorized_keys: keys");
  const auto b = host("host-b", 1, shared_keys + ", coordinator_key: keys/t0.key}");
  ASSERT_EQ(up(a, {"--make-keys"})->wait(60s), 0);
  ASSERT_EQ(up(b, {"--make-keys"})->wait(60s), 0);
  struct stat st {};
  ASSERT_EQ(::stat((dir / "keys/t1.key_secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir / "keys").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  auto ra = up(a);
  auto rb = up(b);
  EXPECT_EQ(ra->wait(300s), 0) << ra->out();
  EXPECT_EQ(rb->wait(300s), 0) << rb->out();
  EXPECT_THAT(ra->out(),
              AllOf(HasSubstr("serving the trainers' rendezvous on " + rendezvous + " (CurveZMQ)"),
                    HasSubstr("rank 0 of 2 connected")));
  EXPECT_THAT(rb->out(), HasSubstr("rank 1 of 2 connected"));
}

}  // namespace
}  // namespace dsactor::testing
