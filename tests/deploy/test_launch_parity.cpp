// DeepSpeed's launcher habits in `dsactor launch`: --include/--exclude/--num_nodes/--num_gpus
// over the hostfile's slots, .deepspeed_env and the exported prefixes on every rank, and the
// openmpi and slurm launchers' one command, run for real through a stand-in mpirun.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "deploy/batch_launch.h"
#include "deploy/deepspeed_env.h"
#include "deploy/host_selection.h"
#include "deploy/launcher.h"
#include "tests/cli/child_process.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::testing {
namespace {

using deploy::HostFilter;
using deploy::HostSlots;
using deploy::LaunchConfigError;
using deploy::SelectedHost;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

const std::vector<HostSlots> kHosts = {{"worker-0", 4}, {"worker-1", 2}, {"worker-2", 2}};

// "worker-0:0,1 worker-2:0,1": what a selection keeps, to compare in one line.
std::string layout(const std::vector<SelectedHost>& hosts) {
  std::string s;
  for (const auto& h : hosts) {
    if (!s.empty()) s += " ";
    s += h.host + ":";
    for (size_t i = 0; i < h.slots.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(h.slots[i]);
    }
  }
  return s;
}

std::string error_of(const HostFilter& f) {
  try {
    deploy::select_hosts(kHosts, f);
  } catch (const LaunchConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(HostSelection, IncludeExcludeNodesAndGpusAsDeepSpeedReadsThem) {
  EXPECT_EQ(layout(deploy::select_hosts(kHosts, {})), "worker-0:0,1,2,3 worker-1:0,1 worker-2:0,1");
  EXPECT_EQ(layout(deploy::select_hosts(kHosts, {.include = "worker-2@worker-0:1,3"})),
            "worker-0:1,3 worker-2:0,1");  // hostfile order, not the flag's
  EXPECT_EQ(layout(deploy::select_hosts(kHosts, {.exclude = "worker-1@worker-0:0"})),
            "worker-0:1,2,3 worker-2:0,1");
  EXPECT_EQ(layout(deploy::select_hosts(kHosts, {.exclude = "worker-1:0,1"})),
            "worker-0:0,1,2,3 worker-2:0,1");  // a host left without slots goes
  EXPECT_EQ(layout(deploy::select_hosts(kHosts, {.num_nodes = 2})),
            "worker-0:0,1,2,3 worker-1:0,1");
  EXPECT_EQ(layout(deploy::select_hosts(kHosts, {.num_nodes = 2, .num_gpus = 1})),
            "worker-0:0 worker-1:0");
  const auto sel = deploy::select_hosts(kHosts, {.include = "worker-0:1,3@worker-1:0"});
  EXPECT_FALSE(sel[0].leading_slots);
  EXPECT_TRUE(sel[1].leading_slots);
  EXPECT_EQ(sel[1].slots, std::vector<int>{0});  // one of worker-1's two slots
}

TEST(HostSelection, RefusalsNameTheFlagAndTheValue) {
  EXPECT_THAT(error_of({.include = "worker-0", .exclude = "worker-1"}),
              HasSubstr("mutually exclusive"));
  EXPECT_THAT(error_of({.include = "worker-9"}),
              HasSubstr("--include names host 'worker-9', which the hostfile does not list"));
  EXPECT_THAT(error_of({.exclude = "worker-1:2"}),
              HasSubstr("--exclude names slot 2 of host 'worker-1', which has slots 0..1"));
  EXPECT_THAT(error_of({.include = "worker-0:x"}), HasSubstr("slot 'x' of host 'worker-0'"));
  EXPECT_THAT(error_of({.include = "@worker-0"}), HasSubstr("expected HOST[:SLOT,...]"));
  EXPECT_THAT(error_of({.num_nodes = 0}), HasSubstr("--num_nodes 0 is not allowed"));
  EXPECT_THAT(error_of({.num_gpus = 3}),
              HasSubstr("--num_gpus 3 is more than the 2 slot(s) selected on host 'worker-1'"));
  EXPECT_THAT(error_of({.exclude = "worker-0@worker-1@worker-2"}), HasSubstr("no slot"));
}

deploy::LaunchPlanOptions options() {
  deploy::LaunchPlanOptions o;
  o.workdir = "/wd";
  o.binary = "/opt/dsactor";
  o.trainer_args = {"--steps", "3"};
  o.exports = {{"NCCL_DEBUG", "INFO"}, {"FOO", "a b"}};
  return o;
}

TEST(LaunchPlan, ChosenSlotsBecomeCudaVisibleDevicesAndExportsComeFirst) {
  const auto plan = deploy::plan_launch_on(
      deploy::select_hosts(kHosts, {.include = "worker-0:1,3@worker-1"}), options());
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[1].remote_command,
            "cd /wd && env NCCL_DEBUG=INFO 'FOO=a b' CUDA_VISIBLE_DEVICES=1,3 RANK=1 WORLD_SIZE=4 "
            "LOCAL_RANK=1 MASTER_ADDR=worker-0 MASTER_PORT=29500 /opt/dsactor start --role "
            "trainer --steps 3");
  EXPECT_EQ(plan[2].remote_command,  // worker-1 keeps its leading slots: no device list
            "cd /wd && env NCCL_DEBUG=INFO 'FOO=a b' RANK=2 WORLD_SIZE=4 LOCAL_RANK=0 "
            "MASTER_ADDR=worker-0 MASTER_PORT=29500 /opt/dsactor start --role trainer --steps 3");
}

TEST(BatchLaunch, OpenMpiAndSlurmCommandLines) {
  const auto hosts = deploy::select_hosts(kHosts, {.num_gpus = 2});
  auto o = options();
  o.master_port = 1234;
  EXPECT_THAT(deploy::plan_batch_launch(deploy::BatchLauncher::kOpenMpi, hosts, o, {}),
              ElementsAre("mpirun", "-n", "6", "-H", "worker-0:2,worker-1:2,worker-2:2", "-wdir",
                          "/wd", "-x", "NCCL_DEBUG=INFO", "-x", "FOO=a b", "-x",
                          "MASTER_ADDR=worker-0", "-x", "MASTER_PORT=1234", "/opt/dsactor", "start",
                          "--role", "trainer", "--steps", "3"));
  EXPECT_THAT(
      deploy::plan_batch_launch(deploy::BatchLauncher::kSlurm, hosts, o, {"srun", "-p", "gpu"}),
      ElementsAre("srun", "-p", "gpu", "-n", "6", "--nodes", "3", "--nodelist",
                  "worker-0,worker-1,worker-2", "--chdir", "/wd",
                  "--export=ALL,NCCL_DEBUG=INFO,FOO=a b,MASTER_ADDR=worker-0,"
                  "MASTER_PORT=1234",
                  "/opt/dsactor", "start", "--role", "trainer", "--steps", "3"));
  // Chosen slots need per-host device lists, which one mpirun/srun cannot give.
  const auto chosen = deploy::select_hosts(kHosts, {.include = "worker-0:2"});
  EXPECT_THROW(deploy::plan_batch_launch(deploy::BatchLauncher::kOpenMpi, chosen, o, {}),
               LaunchConfigError);
  o.exports = {{"LIST", "a,b"}};
  EXPECT_THROW(deploy::plan_batch_launch(deploy::BatchLauncher::kSlurm, hosts, o, {}),
               LaunchConfigError);
  o.trainer_args = {"--rank", "1"};
  EXPECT_THROW(deploy::plan_batch_launch(deploy::BatchLauncher::kOpenMpi, hosts, o, {}),
               LaunchConfigError);
}

TEST(DeepSpeedEnv, FilesThenPrefixesLastValueWins) {
  TempDir home, cwd;
  write_file(home.path() / ".deepspeed_env", "# comment\n\nA=home\nB=x=y\n");
  write_file(cwd.path() / ".deepspeed_env", "A=cwd\r\n");
  const std::map<std::string, std::string> env = {
      {"NCCL_SOCKET_IFNAME", "eth1"}, {"UCX_TLS", "tcp"}, {"HOME", "/h"}, {"A", "shell"}};
  const deploy::EnvLookup lookup = [&](const std::string& n) -> std::optional<std::string> {
    const auto it = env.find(n);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  const auto got = deploy::launch_exports({home.path(), cwd.path()}, lookup,
                                          {"HOME", "NCCL_SOCKET_IFNAME", "UCX_TLS", "A"});
  const deploy::EnvAssignments want = {
      {"NCCL_SOCKET_IFNAME", "eth1"}, {"UCX_TLS", "tcp"}, {"A", "cwd"}, {"B", "x=y"}};
  EXPECT_EQ(got, want);
  write_file(cwd.path() / ".deepspeed_env", "A=1\nnot an assignment\n");
  try {
    deploy::read_env_file(cwd.path() / ".deepspeed_env");
    FAIL() << "no error";
  } catch (const LaunchConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr(".deepspeed_env:2: expected NAME=VALUE"));
  }
}

// The whole openmpi path for real: `dsactor launch --launcher openmpi` runs a stand-in
// mpirun (DSACTOR_LAUNCH_MPIRUN) that starts -n copies with Open MPI's rank variables, the
// -x variables and -wdir, as mpirun does; each rank reports what it got. The run's token
// reaches the ranks through mpirun's environment, named by `-x` without its value.
TEST(LaunchCliParity, OpenMpiLauncherRunsEveryRankWithTheExportedEnvironment) {
  TempDir dir;
  write_file(dir.path() / "mpirun",
             "#!/bin/sh\n"
             "echo \"$*\" > \"" +
                 (dir.path() / "mpirun.args").string() +
                 "\"\n"
                 "n=1\n"
                 "while [ $# -gt 0 ]; do case \"$1\" in\n"
                 "  -n) n=$2; shift 2;; -H) shift 2;; -wdir) cd \"$2\"; shift 2;;\n"
                 "  -x) export \"$2\"; shift 2;; *) break;; esac; done\n"
                 "i=0; while [ $i -lt $n ]; do\n"
                 "  OMPI_COMM_WORLD_RANK=$i OMPI_COMM_WORLD_SIZE=$n OMPI_COMM_WORLD_LOCAL_RANK=$i "
                 "\"$@\" & i=$((i+1)); done\n"
                 "wait\n");
  write_file(dir.path() / "rank.sh",
             "#!/bin/sh\necho \"rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE in $(pwd): "
             "FOO=$FOO NCCL_DEBUG=$NCCL_DEBUG MASTER=$MASTER_ADDR:$MASTER_PORT args=$*\"\n"
             "echo \"token=$DSACTOR_JOB_TOKEN\"\n");
  for (const char* f : {"mpirun", "rank.sh"}) ::chmod((dir.path() / f).c_str(), 0755);
  write_file(dir.path() / "hosts", "localhost slots=2\nother slots=1\n");
  write_file(dir.path() / ".deepspeed_env", "FOO=from the env file\n");
  std::filesystem::create_directories(dir.path() / "wd");
  DsactorProcess launch(
      {"launch", "--hostfile", (dir.path() / "hosts").string(), "--launcher", "openmpi",
       "--exclude", "other", "--master_port", "29611", "--remote-binary",
       (dir.path() / "rank.sh").string(), "--workdir", (dir.path() / "wd").string(), "--secret-key",
       "/k/job.key_secret", "--", "--steps", "2"},
      dir.path() / "out", dir.path() / "err",
      {"DSACTOR_LAUNCH_MPIRUN=" + (dir.path() / "mpirun").string(), "NCCL_DEBUG=WARN",
       "HOME=" + dir.path().string()},
      dir.path());
  ASSERT_EQ(launch.wait(60s), 0) << launch.err();
  const std::string tail = " in " + (dir.path() / "wd").string() +
                           ": FOO=from the env file NCCL_DEBUG=WARN MASTER=localhost:29611 "
                           "args=start --role trainer --steps 2 --secret-key /k/job.key_secret "
                           "--coordinator-key /k/job.key_secret";
  EXPECT_THAT(launch.out(), HasSubstr("rank 0 of 2" + tail));
  EXPECT_THAT(launch.out(), HasSubstr("rank 1 of 2" + tail));
  const std::string out = launch.out();
  const auto at = out.find("token=");
  ASSERT_NE(at, std::string::npos);
  const std::string token = out.substr(at + 6, out.find('\n', at) - at - 6);
  EXPECT_TRUE(actors::is_job_token(token)) << token;
  const std::string args = read_file(dir.path() / "mpirun.args");
  EXPECT_THAT(args, HasSubstr("-x DSACTOR_JOB_TOKEN "));
  EXPECT_THAT(args, ::testing::Not(HasSubstr(token)));  // in no argv
}

}  // namespace
}  // namespace dsactor::testing
