#pragma once
// Runs the real `dsactor` binary (DSACTOR_BINARY) as a user would and captures its output.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dsactor::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline CommandResult run_dsactor(const std::string& args, const std::filesystem::path& workdir) {
  const auto err_file = workdir / ("stderr_" + std::to_string(::getpid()) + ".txt");
  const std::string cmd = "cd '" + workdir.string() + "' && '" DSACTOR_BINARY "' --threads 2 " + args +
                          " 2>'" + err_file.string() + "'";
  CommandResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err_file);
  std::stringstream ss;
  ss << e.rdbuf();
  r.err = ss.str();
  std::filesystem::remove(err_file);
  return r;
}

inline std::string repo_path(const std::string& rel) { return std::string(DSACTOR_SOURCE_DIR) + "/" + rel; }

}  // namespace dsactor::testing
