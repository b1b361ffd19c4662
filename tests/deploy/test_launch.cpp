// `dsactor launch`: the per-rank commands (layout, environment, quoting) and real runs with
// a local stand-in for ssh (DSACTOR_LAUNCH_SSH: a script that runs the command here, the
// transport only) starting either a script that reports what it got, or the real trainer.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "deploy/launcher.h"
#include "tests/cli/child_process.h"
#include "tests/deploy/deploy_test_util.h"

extern char** environ;

namespace dsactor::testing {
namespace {

using deploy::HostSlots;
using deploy::LaunchPlanOptions;
using deploy::LaunchTransport;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

LaunchPlanOptions options(std::vector<std::string> args = {}) {
  LaunchPlanOptions o;
  o.workdir = "/work dir";
  o.binary = "/opt/ds/dsactor";
  o.trainer_args = std::move(args);
  return o;
}

TEST(LaunchPlan, RanksFollowTheHostfileAndSlots) {
  const auto plan =
      deploy::plan_launch({{"node-a", 2}, {"node-b", 1}, {"node-c", 2}}, options({"--steps", "3"}));
  ASSERT_EQ(plan.size(), 5u);
  const std::vector<std::tuple<int, int, std::string>> want = {
      {0, 0, "node-a"}, {1, 1, "node-a"}, {2, 0, "node-b"}, {3, 0, "node-c"}, {4, 1, "node-c"}};
  for (size_t i = 0; i < plan.size(); ++i) {
    EXPECT_EQ(plan[i].rank, std::get<0>(want[i]));
    EXPECT_EQ(plan[i].local_rank, std::get<1>(want[i]));
    EXPECT_EQ(plan[i].host, std::get<2>(want[i]));
  }
  // rank 3: first slot of the third host; the master is the first host by default.
  EXPECT_EQ(plan[3].remote_command,
            "cd '/work dir' && env RANK=3 WORLD_SIZE=5 LOCAL_RANK=0 MASTER_ADDR=node-a "
            "MASTER_PORT=29500 /opt/ds/dsactor start --role trainer --steps 3");
  EXPECT_THAT(plan[3].argv, ElementsAre("ssh", "node-c", plan[3].remote_command));
}

TEST(LaunchPlan, QuotingSurvivesTheRemoteShell) {
  auto o = options({"--data", "it's here", "--out", "$HOME/x;rm"});
  o.master_addr = "10.0.0.9";
  o.master_port = 29600;
  const auto plan = deploy::plan_launch({{"h", 1}}, o);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].remote_command,
            "cd '/work dir' && env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=10.0.0.9 "
            "MASTER_PORT=29600 /opt/ds/dsactor start --role trainer --data 'it'\\''s here' --out "
            "'$HOME/x;rm'");

  // And a real shell hands the binary exactly those arguments, in that directory.
  TempDir dir;
  write_file(dir / "args.sh", "#!/bin/sh\npwd\nfor a; do echo \"[$a]\"; done\n");
  ::chmod((dir / "args.sh").c_str(), 0755);
  std::filesystem::create_directories(dir / "work dir");
  o.workdir = (dir / "work dir").string();
  o.binary = (dir / "args.sh").string();
  const auto cmd = deploy::plan_launch({{"h", 1}}, o)[0].remote_command;
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string got;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) got += buf;
  EXPECT_EQ(::pclose(p), 0);
  EXPECT_EQ(
      got,
      o.workdir + "\n[start]\n[--role]\n[trainer]\n[--data]\n[it's here]\n[--out]\n[$HOME/x;rm]\n");
}

TEST(LaunchPlan, PdshAndACustomTransport) {
  auto o = options();
  o.transport = LaunchTransport::kPdsh;
  const auto pdsh = deploy::plan_launch({{"a", 1}, {"b", 1}}, o);
  EXPECT_THAT(pdsh[1].argv, ElementsAre("pdsh", "-S", "-w", "b", pdsh[1].remote_command));
  o.transport = LaunchTransport::kSsh;
  o.transport_command = deploy::split_words("  ssh  -p 2222\t-q ");
  const auto ssh = deploy::plan_launch({{"a", 1}}, o);
  EXPECT_THAT(ssh[0].argv, ElementsAre("ssh", "-p", "2222", "-q", "a", ssh[0].remote_command));
}

TEST(LaunchPlan, Refusals) {
  EXPECT_THROW(deploy::plan_launch({}, options()), deploy::LaunchConfigError);
  try {
    deploy::plan_launch({{"a", 2}}, options({"--config", "c.json", "--rank", "1"}));
    FAIL();
  } catch (const deploy::LaunchConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("\"--rank\""), HasSubstr("RANK, WORLD_SIZE")));
  }
  EXPECT_THROW(deploy::plan_launch({{"a", 2}}, options({"--world-size=2"})),
               deploy::LaunchConfigError);
  auto o = options();
  o.master_port = 70000;
  EXPECT_THROW(deploy::plan_launch({{"a", 1}}, o), deploy::LaunchConfigError);
}

// `dsactor launch ARGS` in the background with extra environment, stdout/stderr in
// dir/launch.out and dir/launch.err.
class Launch : public DsactorProcess {
 public:
  Launch(const TempDir& dir, std::vector<std::string> args, std::vector<std::string> extra_env = {})
      : DsactorProcess(with_launch(std::move(args)), dir / "launch.out", dir / "launch.err",
                       std::move(extra_env)) {}

 private:
  static std::vector<std::string> with_launch(std::vector<std::string> args) {
    args.insert(args.begin(), "launch");
    return args;
  }
};

void write_script(const std::filesystem::path& p, const std::string& text) {
  write_file(p, text);
  ::chmod(p.c_str(), 0755);
}

class LaunchCli : public ::testing::Test {
 protected:
  void SetUp() override {
    // The transport stand-in: `ssh HOST CMD` becomes `sh -c CMD` here (stdin passed on, as
    // ssh does); it notes the host, and its whole argv in transport.args.
    write_script(dir / "fake-ssh",
                 "#!/bin/sh\necho \"$*\" >> \"" + (dir / "transport.args").string() +
                     "\"\necho \"transport to $1\" >&2\nshift\nexec sh -c \"$*\"\n");
    // What a rank runs instead of dsactor: reports its environment, cwd and argv, records
    // its pid, then either fails (RANK == FAIL_RANK) or lingers (SLEEP seconds).
    write_script(dir / "rank.sh",
                 "#!/bin/sh\n"
                 "echo \"$$\" > \"" +
                     (dir / "pid.").string() +
                     "$RANK\"\n"
                     "echo \"RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK "
                     "MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT pwd=$(pwd) args=$*\"\n"
                     "echo \"token=$DSACTOR_JOB_TOKEN\"\n"
                     "if [ \"$RANK\" = \"$FAIL_RANK\" ]; then echo \"rank $RANK gives up\" >&2; "
                     "exit 3; fi\n"
                     "sleep \"${SLEEP:-0}\"\n"
                     "echo \"rank $RANK slept its time out\"\n");
    write_file(dir / "hosts", "# one machine, two slots\nlocalhost slots=2\n");
    std::filesystem::create_directories(dir / "wd");
  }
  std::vector<std::string> env(std::vector<std::string> extra = {}) const {
    extra.push_back("DSACTOR_LAUNCH_SSH=" + (dir / "fake-ssh").string());
    return extra;
  }
  std::vector<std::string> args(std::vector<std::string> trainer_args) const {
    std::vector<std::string> a = {
        "--hostfile", (dir / "hosts").string(), "--remote-binary", (dir / "rank.sh").string(),
        "--workdir",  (dir / "wd").string(),    "--secret-key",    secret().string(),
        "--"};
    a.insert(a.end(), trainer_args.begin(), trainer_args.end());
    return a;
  }

  // One keypair the ranks share (rank 0 serves the rendezvous with it), made on first use.
  std::filesystem::path secret() const { return make_keypair(dir / "keys", "job"); }

  TempDir dir;
};

TEST_F(LaunchCli, DryRunPrintsOneQuotedCommandPerRankAndStartsNothing) {
  write_file(dir / "hosts2", "node-a slots=2\nnode-b slots=1\n");
  Launch l(dir,
           {"--hostfile", (dir / "hosts2").string(), "--dry-run", "--master-port", "29555",
            "--workdir", "/w", "--remote-binary", "/bin/dsactor", "--secret-key",
            "/k/job.key_secret", "--", "--config", "my ds.json"},
           env());
  ASSERT_EQ(l.wait(20s), 0) << l.err();
  // The token is read from stdin by the remote shell; the key flags follow the trainer's.
  const std::string cmd2 =
      "IFS= read -r DSACTOR_JOB_TOKEN && export DSACTOR_JOB_TOKEN && "
      "cd /w && env RANK=2 WORLD_SIZE=3 LOCAL_RANK=0 MASTER_ADDR=node-a MASTER_PORT=29555 "
      "/bin/dsactor start --role trainer --config 'my ds.json' --secret-key /k/job.key_secret "
      "--coordinator-key /k/job.key_secret";
  // The remote command is one argument of the transport, quoted once more for the local shell.
  std::string quoted;
  for (char c : cmd2) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  EXPECT_THAT(l.out(), AllOf(HasSubstr("# 3 rank(s) from "),
                             HasSubstr("[rank 0@node-a] " + (dir / "fake-ssh").string() +
                                       " node-a 'IFS= read -r DSACTOR_JOB_TOKEN && export "
                                       "DSACTOR_JOB_TOKEN && cd /w && env RANK=0 WORLD_SIZE=3 "
                                       "LOCAL_RANK=0 "),
                             HasSubstr("[rank 1@node-a] "), HasSubstr("LOCAL_RANK=1 "),
                             HasSubstr("[rank 2@node-b] " + (dir / "fake-ssh").string() +
                                       " node-b '" + quoted + "'\n")));
  EXPECT_THAT(l.err(), Not(HasSubstr("transport to")));  // nothing ran

  // pdsh passes no stdin on: the token must be a file on the hosts.
  Launch p(dir, {"--hostfile", (dir / "hosts2").string(), "--dry-run", "--launcher", "pdsh",
                 "--secret-key", "/k/job.key_secret"});
  EXPECT_EQ(p.wait(20s), 2);
  EXPECT_THAT(p.err(), HasSubstr("give --job-token-file FILE"));
  Launch q(dir, {"--hostfile", (dir / "hosts2").string(), "--dry-run", "--launcher", "pdsh",
                 "--secret-key", "/k/job.key_secret", "--job-token-file", "/k/job.token"});
  ASSERT_EQ(q.wait(20s), 0) << q.err();
  EXPECT_THAT(q.out(), AllOf(HasSubstr("[rank 2@node-b] pdsh -S -w node-b 'cd "),
                             HasSubstr("--job-token-file /k/job.token")));
  // Without a key, nothing is planned; --insecure passes itself and no token.
  Launch none(dir, {"--hostfile", (dir / "hosts2").string(), "--dry-run"});
  EXPECT_EQ(none.wait(20s), 2);
  EXPECT_THAT(none.err(), HasSubstr("every rank needs --secret-key FILE"));
  Launch plain(dir, {"--hostfile", (dir / "hosts2").string(), "--dry-run", "--insecure"});
  ASSERT_EQ(plain.wait(20s), 0) << plain.err();
  EXPECT_THAT(plain.out(),
              AllOf(HasSubstr("--role trainer --insecure'"), Not(HasSubstr("DSACTOR_JOB_TOKEN")),
                    Not(HasSubstr("--secret-key"))));
}

TEST_F(LaunchCli, EveryRankGetsItsEnvironmentThroughTheTransport) {
  Launch l(dir, args({"--steps", "3", "--data", "it's here"}), env());
  ASSERT_EQ(l.wait(30s), 0) << l.err();
  const std::string keys =
      " --secret-key " + secret().string() + " --coordinator-key " + secret().string();
  const std::string tail = " MASTER_ADDR=localhost MASTER_PORT=29500 pwd=" + (dir / "wd").string() +
                           " args=start --role trainer --steps 3 --data it's here" + keys;
  EXPECT_THAT(l.out(),
              AllOf(HasSubstr("[rank 0@localhost] RANK=0 WORLD_SIZE=2 LOCAL_RANK=0" + tail),
                    HasSubstr("[rank 1@localhost] RANK=1 WORLD_SIZE=2 LOCAL_RANK=1" + tail)));
  EXPECT_THAT(l.out(), HasSubstr("[rank 1@localhost] transport to localhost"));
  EXPECT_THAT(l.err(), HasSubstr("every rank exited 0"));
  // Both ranks hold the run's one token, which no transport argv carried.
  const std::regex token_line("\\[rank ([01])@localhost\\] token=([0-9a-f]{64})\n");
  std::set<std::string> tokens;
  const std::string out = l.out();
  for (std::sregex_iterator it(out.begin(), out.end(), token_line), end; it != end; ++it)
    tokens.insert((*it)[2]);
  ASSERT_EQ(tokens.size(), 1u) << out;
  EXPECT_THAT(read_file(dir / "transport.args"), Not(HasSubstr(*tokens.begin())));
}

TEST_F(LaunchCli, OneFailingRankStopsTheOthersAndIsNamed) {
  Launch l(dir, args({"--config", "x.json"}), env({"FAIL_RANK=1", "SLEEP=60"}));
  const int rc = l.wait(40s);
  EXPECT_EQ(rc, 101) << l.err();                               // 100 + rank
  EXPECT_THAT(l.out(), Not(HasSubstr("slept its time out")));  // rank 0 was stopped
  EXPECT_THAT(l.err(),
              AllOf(HasSubstr("rank 1 on host localhost failed"), HasSubstr("rank 1 gives up")));
  // Rank 0 writes its pid as it starts; stopped even before that, it left none to check.
  const pid_t rank0 = pid_from(dir / "pid.0");
  if (rank0 > 0) {
    EXPECT_TRUE(wait_gone(rank0, 30s)) << "rank 0 survived";
  }
}

TEST_F(LaunchCli, RealTrainerFailureIsPropagated) {
  // The real `dsactor start --role trainer` (no --remote-binary) with a ds_config that does
  // not exist: every rank fails, and launch names the first one that did.
  Launch l(dir,
           {"--hostfile", (dir / "hosts").string(), "--workdir", (dir / "wd").string(),
            "--secret-key", secret().string(), "--", "--config", (dir / "absent.json").string()},
           env());
  const int rc = l.wait(60s);
  EXPECT_THAT(rc, ::testing::AnyOf(100, 101)) << l.err();
  EXPECT_THAT(l.err(), AllOf(::testing::ContainsRegex("rank [01] on host localhost failed"),
                             HasSubstr("absent.json")));
}

TEST_F(LaunchCli, BadHostfileAndArgumentsExit2) {
  write_file(dir / "bad", "localhost slots=two\n");
  Launch l(dir, {"--hostfile", (dir / "bad").string(), "--dry-run"});
  EXPECT_EQ(l.wait(20s), 2);
  EXPECT_THAT(l.err(), HasSubstr((dir / "bad").string() + ":1"));
  Launch r(dir, {"--hostfile", (dir / "hosts").string(), "--dry-run", "--insecure", "--", "--rank",
                 "0"});
  EXPECT_EQ(r.wait(20s), 2);
  EXPECT_THAT(r.err(), HasSubstr("\"--rank\" is not allowed"));
}

}  // namespace
}  // namespace dsactor::testing
