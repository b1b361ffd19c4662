// The trainers' side of the rendezvous's security, through the real binary: a data-parallel
// trainer does not start without a key and the run's token (each error says which flag is
// missing), --insecure serves the store on loopback only, and a rank holding a stranger's key
// cannot join a keyed run: it and rank 0 both stop with errors naming the cause; the
// collectives bind the interface named (--comm-interface, --comm-address).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/cli/child_process.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class RendezvousCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string corpus;
    for (int i = 0; i < 300; ++i) corpus += "a stitch in time saves nine\n";
    write_file(dir / "corpus.txt", corpus);
    write_file(dir / "ds.json", R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})");
    coordinator = "tcp://127.0.0.1:" + std::to_string(free_port());
  }
  // Rank `r` of 2 (rank 0 serves the store), plus `extra`.
  std::vector<std::string> rank(int r, std::vector<std::string> extra) const {
    std::vector<std::string> a = {"start",
                                  "--role",
                                  "trainer",
                                  "--config",
                                  "ds.json",
                                  "--data",
                                  "corpus.txt",
                                  "--steps",
                                  "2",
                                  "--seq",
                                  "16",
                                  "--rank",
                                  std::to_string(r),
                                  "--world-size",
                                  "2",
                                  "--coordinator",
                                  coordinator,
                                  "--comm-timeout-ms",
                                  "3000"};
    if (r == 0) a.push_back("--serve-coordinator");
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::unique_ptr<DsactorProcess> start(const std::string& name, std::vector<std::string> args,
                                        std::vector<std::string> env = {}) const {
    return std::make_unique<DsactorProcess>(std::move(args), dir / (name + ".log"),
                                            dir / (name + ".log"), env, dir.path());
  }

  TempDir dir;
  std::string coordinator;
};

TEST_F(RendezvousCli, ATrainerWithoutKeyOrTokenDoesNotStart) {
  auto bare = start("bare", rank(0, {}));
  EXPECT_EQ(bare->wait(60s), 1);
  EXPECT_THAT(bare->err(), AllOf(HasSubstr("the run's job token"), HasSubstr("--job-token-file"),
                                 HasSubstr("DSACTOR_JOB_TOKEN")));
  const std::string token = make_job_token_file(dir / "job.token").string();
  auto no_key = start("no_key", rank(0, {"--job-token-file", token}));
  EXPECT_EQ(no_key->wait(60s), 1);
  EXPECT_THAT(no_key->err(), HasSubstr("--secret-key FILE"));
  const std::string secret = make_keypair(dir / "keys", "t1").string();
  auto no_server = start("no_server", rank(1, {"--secret-key", secret}),
                         {"DSACTOR_JOB_TOKEN=" + actors::read_job_token_file(token)});
  EXPECT_EQ(no_server->wait(60s), 1);
  EXPECT_THAT(no_server->err(), HasSubstr("--coordinator-key FILE"));
  // A token file others can read is refused, as an ssh key would be.
  ::chmod(token.c_str(), 0644);
  auto loose = start("loose", rank(0, {"--job-token-file", token, "--secret-key", secret}));
  EXPECT_EQ(loose->wait(60s), 1);
  EXPECT_THAT(loose->err(), HasSubstr("chmod 600"));
}

TEST_F(RendezvousCli, InsecureServesTheStoreOnLoopbackOnly) {
  coordinator = "tcp://0.0.0.0:" + std::to_string(free_port());
  auto remote = start("remote", rank(0, {"--insecure"}));
  EXPECT_EQ(remote->wait(60s), 1);
  EXPECT_THAT(remote->err(), HasSubstr("--insecure is allowed on loopback only"));
  coordinator = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto r0 = start("r0", rank(0, {"--insecure"}));
  auto r1 = start("r1", rank(1, {"--insecure"}));
  EXPECT_EQ(r0->wait(240s), 0) << r0->err();
  EXPECT_EQ(r1->wait(240s), 0) << r1->err();
  EXPECT_THAT(r0->err(), AllOf(HasSubstr("WITHOUT authentication (--insecure)"),
                               HasSubstr("rank 0 of 2 connected")));
}

TEST_F(RendezvousCli, ARankWithAStrangersKeyCannotJoin) {
  const auto shared = shared_trainer_keys(dir.path());
  auto r0 = start("r0", rank(0, shared));
  // Rank 1 knows the server's key and the token, but its own key is not on rank 0's list.
  auto stranger = shared;
  stranger[1] = make_keypair(dir / "stranger", "me").string();
  auto r1 = start("r1", rank(1, stranger));
  EXPECT_EQ(r1->wait(120s), 1);
  EXPECT_THAT(r1->err(), AllOf(HasSubstr("did not answer"), HasSubstr("--secret-key")));
  EXPECT_EQ(r0->wait(120s), 1);
  EXPECT_THAT(r0->err(), HasSubstr("rank 1 did not join"));
  EXPECT_THAT(r0->err(), HasSubstr("refused a connection"));
}

// Gloo's transport is not authenticated: it binds the interface named, and a name that is
// no interface stops the rank before it listens anywhere.
TEST_F(RendezvousCli, TheCollectivesBindTheNamedInterface) {
  const auto shared = shared_trainer_keys(dir.path());
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), shared.begin(), shared.end());
    return extra;
  };
  auto r0 = start("r0", rank(0, with({"--comm-interface", "lo"})));
  auto r1 = start("r1", rank(1, with({"--comm-address", "127.0.0.1"})));
  EXPECT_EQ(r0->wait(240s), 0) << r0->err();
  EXPECT_EQ(r1->wait(240s), 0) << r1->err();
  EXPECT_THAT(r0->err(),
              HasSubstr("rank 0 of 2 connected through " + coordinator + " (Gloo over 127.0.0.1)"));
  EXPECT_THAT(r1->err(), HasSubstr("(Gloo over 127.0.0.1)"));
  auto bad = start("bad", rank(0, with({"--comm-interface", "nosuch0"})));
  EXPECT_EQ(bad->wait(60s), 1);
  EXPECT_THAT(bad->err(), HasSubstr("--comm-interface nosuch0: no such interface"));
}

}  // namespace
}  // namespace dsactor::testing
