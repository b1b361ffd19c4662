// The deploy file's `security:` block and what `dsactor up` makes of it (deploy/run_keys.h):
// every role's key files, its command line's key flags, the keys and allow-lists generated
// for a local run (each server admits exactly its clients), keys given by hand, the token, and
// the refusals (allow_remote without keys, a rendezvous elsewhere without its key) and the
// warnings (each role allow_remote lets listen beyond loopback).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

#include "deploy/deploy_config.h"
#include "deploy/run_keys.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::deploy {
namespace {

using dsactor::testing::TempDir;
using dsactor::testing::write_file;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

// The value after `flag` in argv (every one, for a repeated flag).
std::vector<std::string> values_of(const std::vector<std::string>& argv, const std::string& flag) {
  std::vector<std::string> out;
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == flag) out.push_back(argv[i + 1]);
  return out;
}

unsigned mode_of(const std::filesystem::path& p) {
  struct stat st {};
  ::stat(p.c_str(), &st);
  return st.st_mode & 0777;
}

class DeploySecurity : public ::testing::Test {
 protected:
  void SetUp() override { write_file(dir / "ds.json", "{}"); }
  DeployConfig load(const std::string& yaml) {
    write_file(dir / "d.yaml", yaml);
    return load_deploy_config(dir / "d.yaml");
  }
  std::string error_of(const std::string& yaml) {
    try {
      load(yaml);
    } catch (const DeployConfigError& e) {
      return e.what();
    }
    return "(no error)";
  }
  std::set<std::string> allowed(const std::filesystem::path& list) {
    const auto keys = security::read_authorized_keys(list);
    return {keys.begin(), keys.end()};
  }
  std::string key_of(const std::string& name) {
    return security::read_public_key_file(dir / "keys" / (name + ".key"));
  }
  TempDir dir;
};

const char* const kTwoServicesTwoTrainers = R"(
security: {keys_dir: keys}
roles:
  - {role: coordinator, name: coord}
  - {role: offload, name: o0}
  - {role: offload, name: o1}
  - {role: trainer, name: t0, config: ds.json, offload: [o0, o1]}
  - {role: trainer, name: t1, config: ds.json, offload: o1}
)";

TEST_F(DeploySecurity, EveryRoleIsGivenItsKeysAndWhomItTrusts) {
  const auto cfg = load(kTwoServicesTwoTrainers);
  const auto keys = dir / "keys";
  EXPECT_EQ(cfg.security.keys_dir, keys);
  const auto o0 = to_command_line(cfg, cfg.roles[1]);
  EXPECT_THAT(values_of(o0, "--secret-key"), ElementsAre((keys / "o0.key_secret").string()));
  EXPECT_THAT(values_of(o0, "--authorized-keys"), ElementsAre((keys / "o0.authorized").string()));
  const auto coord = to_command_line(cfg, cfg.roles[0]);
  EXPECT_THAT(values_of(coord, "--authorized-keys"),
              ElementsAre((keys / "coord.authorized").string()));
  const auto t0 = to_command_line(cfg, cfg.roles[3]);
  EXPECT_THAT(values_of(t0, "--secret-key"), ElementsAre((keys / "t0.key_secret").string()));
  // One --offload-key per --offload, in the same order.
  EXPECT_THAT(values_of(t0, "--offload"), ElementsAre(cfg.roles[1].listen, cfg.roles[2].listen));
  EXPECT_THAT(values_of(t0, "--offload-key"),
              ElementsAre((keys / "o0.key").string(), (keys / "o1.key").string()));
  EXPECT_THAT(values_of(t0, "--coordinator-key"), ElementsAre((keys / "coord.key").string()));
  EXPECT_THAT(t0, Not(Contains("--authorized-keys")));  // a client only
  EXPECT_THAT(t0, Not(Contains("--insecure")));
}

TEST_F(DeploySecurity, UpMakesTheKeysAndEachServerAdmitsExactlyItsClients) {
  const auto cfg = load(kTwoServicesTwoTrainers);
  make_run_keys(cfg);
  const auto keys = dir / "keys";
  EXPECT_EQ(mode_of(keys), 0700u);
  for (const char* name : {"coord", "o0", "o1", "t0", "t1"}) {
    EXPECT_EQ(mode_of(keys / (std::string(name) + ".key_secret")), 0600u) << name;
    EXPECT_NO_THROW(security::read_secret_key_file(keys / (std::string(name) + ".key_secret")));
  }
  // A server's own key is on its list too (the readiness probe proves the coordinator's).
  EXPECT_THAT(allowed(keys / "o0.authorized"), UnorderedElementsAre(key_of("o0"), key_of("t0")));
  EXPECT_THAT(allowed(keys / "o1.authorized"),
              UnorderedElementsAre(key_of("o1"), key_of("t0"), key_of("t1")));
  EXPECT_THAT(allowed(keys / "coord.authorized"),
              UnorderedElementsAre(key_of("coord"), key_of("t0"), key_of("t1")));
  EXPECT_EQ(mode_of(keys / "o0.authorized"), 0600u);
  // A second run keeps the keys it made (the allow-lists are written again, the same).
  const std::string t0 = key_of("t0");
  make_run_keys(load(kTwoServicesTwoTrainers));
  EXPECT_EQ(key_of("t0"), t0);
}

TEST_F(DeploySecurity, RankZeroServingTheRendezvousAdmitsEveryTrainer) {
  const auto cfg = load(R"(
security: {keys_dir: keys}
roles:
  - {role: trainer, name: t0, config: ds.json}
  - {role: trainer, name: t1, config: ds.json}
)");
  ASSERT_TRUE(cfg.rendezvous_in_rank0);
  make_run_keys(cfg);
  const auto keys = dir / "keys";
  const auto t0 = to_command_line(cfg, cfg.roles[0]);
  EXPECT_THAT(t0, Contains("--serve-coordinator"));
  EXPECT_THAT(values_of(t0, "--authorized-keys"), ElementsAre((keys / "t0.authorized").string()));
  EXPECT_THAT(values_of(to_command_line(cfg, cfg.roles[1]), "--coordinator-key"),
              ElementsAre((keys / "t0.key").string()));
  EXPECT_THAT(allowed(keys / "t0.authorized"), UnorderedElementsAre(key_of("t0"), key_of("t1")));
}

TEST_F(DeploySecurity, KeysGivenByHandAreUsedAndNeverMade) {
  const auto hand = dir / "hand";
  const auto secret = dsactor::testing::make_keypair(hand, "svc");
  write_file(hand / "svc.clients", "# by hand\n");  // checked when read: empty is refused
  const std::string yaml =
      "security: {keys_dir: keys}\nroles:\n"
      "  - {role: offload, name: o, secret_key: hand/svc.key_secret, "
      "authorized_keys: hand/svc.clients}\n"
      "  - {role: trainer, name: t, config: ds.json}\n";
  auto cfg = load(yaml);
  EXPECT_EQ(cfg.roles[0].secret_key, secret);
  EXPECT_EQ(cfg.roles[0].public_key, hand / "svc.key");  // the secret's twin
  EXPECT_THAT(values_of(to_command_line(cfg, cfg.roles[1]), "--offload-key"),
              ElementsAre((hand / "svc.key").string()));
  // The hand-written list is not replaced, and a bad one fails here, naming the role.
  EXPECT_THAT(
      [&] {
        try {
          make_run_keys(cfg);
        } catch (const DeployConfigError& e) {
          return std::string(e.what());
        }
        return std::string();
      }(),
      AllOf(HasSubstr("roles[0] \"o\""), HasSubstr("svc.clients")));
  write_file(hand / "svc.clients", security::read_public_key_file(secret) + "\n");
  EXPECT_NO_THROW(make_run_keys(cfg));
  // A secret_key named by hand that does not exist is an error, not a fresh key.
  cfg = load(
      "security: {keys_dir: keys}\nroles:\n"
      "  - {role: offload, name: o, secret_key: hand/nope.key_secret}\n");
  try {
    make_run_keys(cfg);
    ADD_FAILURE() << "made a key named by hand";
  } catch (const DeployConfigError& e) {
    EXPECT_THAT(e.what(),
                AllOf(HasSubstr("nope.key_secret does not exist"), HasSubstr("dsactor keygen")));
  }
}

TEST_F(DeploySecurity, InsecureGivesEveryRoleInsecureAndNoKeys) {
  const auto cfg = load(R"(
security: {insecure: true, keys_dir: keys}
roles:
  - {role: offload, name: o}
  - {role: trainer, name: t0, config: ds.json}
  - {role: trainer, name: t1, config: ds.json}
)");
  for (const auto& r : cfg.roles) {
    const auto argv = to_command_line(cfg, r);
    EXPECT_THAT(argv, Contains("--insecure")) << r.name;
    for (const char* flag :
         {"--secret-key", "--authorized-keys", "--offload-key", "--coordinator-key"})
      EXPECT_THAT(argv, Not(Contains(flag))) << r.name;
  }
}

TEST_F(DeploySecurity, RemoteListenersNeedKeys) {
  // allow_remote is what lets a role listen beyond loopback; without keys it is refused.
  EXPECT_THAT(error_of("allow_remote: true\nsecurity: {insecure: true}\n"
                       "roles: [{role: offload, listen: \"tcp://0.0.0.0:7000\"}]\n"),
              AllOf(HasSubstr("allow_remote"), HasSubstr("needs keys")));
  EXPECT_THAT(error_of("security: {insecure: true}\n"
                       "roles: [{role: offload, listen: \"tcp://10.1.2.3:7000\"}]\n"),
              HasSubstr("allow_remote: true"));
  // Allowed with keys, and said: each role that listens beyond loopback is named.
  const auto remote = load(
      "allow_remote: true\nroles: [{role: offload, name: o, listen: \"tcp://0.0.0.0:7000\"}, "
      "{role: offload, name: local}]\n");
  EXPECT_THAT(remote_listener_warnings(remote),
              ElementsAre(AllOf(HasSubstr("roles[0] \"o\" listens on tcp://0.0.0.0:7000"),
                                HasSubstr("docs/security.md"))));
  EXPECT_THAT(remote_listener_warnings(load("allow_remote: true\nroles: [{role: offload}]\n")),
              ElementsAre(HasSubstr("every role listens on loopback")));
  EXPECT_TRUE(remote_listener_warnings(load("roles: [{role: offload}]\n")).empty());
  EXPECT_THAT(error_of("security: {insecur: true}\nroles: [{role: offload}]\n"),
              HasSubstr("did you mean \"security.insecure\""));
}

// Gloo's and NCCL's transports carry no authentication: a deployment names where they bind.
TEST_F(DeploySecurity, TheCollectivesBindWhereTheFileSays) {
  const auto cfg = load(R"(
roles:
  - {role: trainer, config: ds.json, comm_interface: eth1}
  - {role: trainer, config: ds.json, comm_address: 10.0.0.7}
)");
  EXPECT_THAT(values_of(to_command_line(cfg, cfg.roles[0]), "--comm-interface"),
              ElementsAre("eth1"));
  EXPECT_THAT(values_of(to_command_line(cfg, cfg.roles[1]), "--comm-address"),
              ElementsAre("10.0.0.7"));
  EXPECT_THAT(error_of("roles: [{role: offload, comm_interface: eth1}]"),
              HasSubstr("roles[0].comm_interface"));
}

TEST_F(DeploySecurity, TheRunsToken) {
  const auto cfg = load("roles: [{role: offload}]\n");
  const std::string a = run_job_token(cfg), b = run_job_token(cfg);
  EXPECT_TRUE(actors::is_job_token(a));
  EXPECT_NE(a, b);  // one per run
  const auto with_file = load("security: {job_token_file: run.token}\nroles: [{role: offload}]\n");
  EXPECT_THROW(run_job_token(with_file), DeployConfigError);  // missing, and not told to make it
  const std::string made = run_job_token(with_file, /*create_file=*/true);
  EXPECT_EQ(mode_of(dir / "run.token"), 0600u);
  EXPECT_EQ(run_job_token(with_file), made);
  ::chmod((dir / "run.token").c_str(), 0644);
  try {
    run_job_token(with_file);
    ADD_FAILURE() << "read a token others can read";
  } catch (const DeployConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("chmod 600"));
  }
}

TEST_F(DeploySecurity, ARunsOwnKeysDirectoryIsPrivateAndGoesAway) {
  std::filesystem::path path;
  {
    RunKeysDir run;
    path = run.path();
    EXPECT_EQ(mode_of(path), 0700u);
    auto cfg =
        load("roles: [{role: offload, name: o}, {role: trainer, name: t, config: ds.json}]\n");
    resolve_key_files(cfg, path);
    make_run_keys(cfg);
    EXPECT_TRUE(std::filesystem::exists(path / "t.key_secret"));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace dsactor::deploy
