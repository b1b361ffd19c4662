// Launcher environments (torchrun, Open MPI, Slurm), their precedence and errors, and
// DeepSpeed hostfiles.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <unistd.h>

#include "deploy/launch_env.h"

namespace dsactor::deploy {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    launch_info_from_env(env_of(vars));
  } catch (const LaunchConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnv, NoLauncherVariablesMeansNoLaunch) {
  EXPECT_FALSE(launch_info_from_env(env_of({})).has_value());
  EXPECT_FALSE(launch_info_from_env(env_of({{"MASTER_ADDR", "10.0.0.1"}})).has_value());
}

TEST(LaunchEnv, Torchrun) {
  auto info = launch_info_from_env(env_of({{"RANK", "3"},
                                           {"WORLD_SIZE", "8"},
                                           {"LOCAL_RANK", "1"},
                                           {"MASTER_ADDR", "node0"},
                                           {"MASTER_PORT", "1234"}}));
  ASSERT_TRUE(info);
  EXPECT_EQ(info->rank, 3);
  EXPECT_EQ(info->world_size, 8);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->master_addr, "node0");
  EXPECT_EQ(info->master_port, 1234);
  EXPECT_EQ(info->source, "torchrun");
  // Defaults: local rank = rank, master 127.0.0.1:29500.
  info = launch_info_from_env(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->master_addr, "127.0.0.1");
  EXPECT_EQ(info->master_port, 29500);
}

TEST(LaunchEnv, OpenMpi) {
  auto info = launch_info_from_env(env_of({{"OMPI_COMM_WORLD_RANK", "5"},
                                           {"OMPI_COMM_WORLD_SIZE", "6"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                           {"MASTER_ADDR", "10.1.1.1"}}));
  ASSERT_TRUE(info);
  EXPECT_EQ(info->rank, 5);
  EXPECT_EQ(info->world_size, 6);
  EXPECT_EQ(info->local_rank, 2);
  EXPECT_EQ(info->master_addr, "10.1.1.1");
  EXPECT_EQ(info->source, "openmpi");
}

TEST(LaunchEnv, Slurm) {
  auto info = launch_info_from_env(env_of({{"SLURM_PROCID", "7"},
                                           {"SLURM_NTASKS", "16"},
                                           {"SLURM_LOCALID", "3"},
                                           {"SLURM_LAUNCH_NODE_IPADDR", "192.168.0.9"}}));
  ASSERT_TRUE(info);
  EXPECT_EQ(info->rank, 7);
  EXPECT_EQ(info->world_size, 16);
  EXPECT_EQ(info->local_rank, 3);
  EXPECT_EQ(info->master_addr, "192.168.0.9");
  EXPECT_EQ(info->master_port, 29500);
  EXPECT_EQ(info->source, "slurm");
  // MASTER_ADDR / MASTER_PORT override the launch node.
  info = launch_info_from_env(env_of({{"SLURM_PROCID", "0"},
                                      {"SLURM_NTASKS", "2"},
                                      {"SLURM_LOCALID", "0"},
                                      {"SLURM_LAUNCH_NODE_IPADDR", "192.168.0.9"},
                                      {"MASTER_ADDR", "head"},
                                      {"MASTER_PORT", "40000"}}));
  EXPECT_EQ(info->master_addr, "head");
  EXPECT_EQ(info->master_port, 40000);
}

TEST(LaunchEnv, PrecedenceTorchrunThenOpenMpiThenSlurm) {
  std::map<std::string, std::string> all{{"RANK", "1"},
                                         {"WORLD_SIZE", "2"},
                                         {"OMPI_COMM_WORLD_RANK", "2"},
                                         {"OMPI_COMM_WORLD_SIZE", "4"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                         {"SLURM_PROCID", "0"},
                                         {"SLURM_NTASKS", "1"},
                                         {"SLURM_LOCALID", "0"}};
  EXPECT_EQ(launch_info_from_env(env_of(all))->source, "torchrun");
  all.erase("RANK");
  all.erase("WORLD_SIZE");
  auto info = launch_info_from_env(env_of(all));
  EXPECT_EQ(info->source, "openmpi");
  EXPECT_EQ(info->rank, 2);
  all.erase("OMPI_COMM_WORLD_RANK");
  all.erase("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(launch_info_from_env(env_of(all))->source, "slurm");
}

TEST(LaunchEnv, ErrorsNameTheVariable) {
  auto has = [](const std::string& m, const std::string& part) {
    return m.find(part) != std::string::npos;
  };
  std::string m = error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(m, "RANK=2") && has(m, "WORLD_SIZE=2")) << m;
  m = error_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(m, "RANK='x1' is not an integer")) << m;
  m = error_of({{"RANK", "1"}, {"WORLD_SIZE", "2.5"}});
  EXPECT_TRUE(has(m, "WORLD_SIZE='2.5'")) << m;
  m = error_of({{"RANK", "-1"}, {"WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(m, "RANK=-1")) << m;
  m = error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}});
  EXPECT_TRUE(has(m, "WORLD_SIZE=0")) << m;
  m = error_of({{"RANK", "0"}});
  EXPECT_TRUE(has(m, "WORLD_SIZE is not")) << m;
  m = error_of({{"WORLD_SIZE", "4"}});
  EXPECT_TRUE(has(m, "RANK is not")) << m;
  m = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "abc"}});
  EXPECT_TRUE(has(m, "LOCAL_RANK='abc'")) << m;
  m = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}});
  EXPECT_TRUE(has(m, "LOCAL_RANK=2")) << m;
  m = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
  EXPECT_TRUE(has(m, "MASTER_PORT=70000")) << m;
  m = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}});
  EXPECT_TRUE(has(m, "MASTER_PORT='http'")) << m;
  m = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}});
  EXPECT_TRUE(has(m, "MASTER_ADDR")) << m;
  m = error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(m, "OMPI_COMM_WORLD_LOCAL_RANK is not")) << m;
  m = error_of({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "3"}, {"SLURM_LOCALID", "0"}});
  EXPECT_TRUE(has(m, "SLURM_PROCID=3") && has(m, "SLURM_NTASKS=3")) << m;
  m = error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  EXPECT_TRUE(has(m, "SLURM_LOCALID is not")) << m;
}

TEST(Hostfile, ParsesHostsSlotsCommentsAndBlanks) {
  const auto hosts = parse_hostfile_text(
      "# cluster\n"
      "worker-1 slots=4\n"
      "\n"
      "   worker-2\tslots=2   # trailing comment\n"
      "10.0.0.3 slots=1\n");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "worker-1");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[1].host, "worker-2");
  EXPECT_EQ(hosts[1].slots, 2);
  EXPECT_EQ(hosts[2].host, "10.0.0.3");
  EXPECT_EQ(hosts[2].slots, 1);
}

TEST(Hostfile, ErrorsNameTheLine) {
  auto error = [](const std::string& text) -> std::string {
    try {
      parse_hostfile_text(text, "hf");
    } catch (const LaunchConfigError& e) {
      return e.what();
    }
    return "";
  };
  auto has = [](const std::string& m, const std::string& part) {
    return m.find(part) != std::string::npos;
  };
  EXPECT_TRUE(has(error("a slots=1\nb\n"), "hf:2")) << error("a slots=1\nb\n");
  EXPECT_TRUE(has(error("a slots=1\n\nb slots=0\n"), "hf:3")) << error("a slots=1\n\nb slots=0\n");
  EXPECT_TRUE(has(error("a slots=x\n"), "slots='x'"));
  EXPECT_TRUE(has(error("a slots=-2\n"), "hf:1"));
  EXPECT_TRUE(has(error("a slots=2 extra\n"), "hf:1"));
  EXPECT_TRUE(has(error("a gpus=2\n"), "hf:1"));
  EXPECT_TRUE(has(error("a slots=1\n#c\na slots=2\n"), "hf:3: host 'a' is listed twice"))
      << error("a slots=1\n#c\na slots=2\n");
  EXPECT_TRUE(has(error("# nothing\n\n"), "no hosts"));
}

TEST(Hostfile, ReadsAFileAndNamesAMissingOne) {
  const auto path =
      std::filesystem::temp_directory_path() / ("dsactor_hostfile_" + std::to_string(::getpid()));
  {
    std::ofstream f(path);
    f << "localhost slots=2\n";
  }
  const auto hosts = parse_hostfile(path.string());
  ASSERT_EQ(hosts.size(), 1u);
  EXPECT_EQ(hosts[0].slots, 2);
  std::filesystem::remove(path);
  try {
    parse_hostfile(path.string());
    FAIL() << "missing hostfile parsed";
  } catch (const LaunchConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos);
  }
}

}  // namespace
}  // namespace dsactor::deploy
