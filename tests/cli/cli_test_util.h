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
#include <vector>

namespace dsactor::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// `env` ("NAME=value ...") goes before the binary; without it the run gets two kernel
// threads unless `args` names a count.
inline CommandResult run_dsactor(const std::string& args, const std::filesystem::path& workdir,
                                 const std::string& env = "") {
  const auto err_file = workdir / ("stderr_" + std::to_string(::getpid()) + ".txt");
  const std::string threads =
      !env.empty() || args.rfind("--threads ", 0) == 0 ? "" : "--threads 2 ";
  const std::string cmd = "cd '" + workdir.string() + "' && " + env + " '" DSACTOR_BINARY "' " +
                          threads + args + " 2>'" + err_file.string() + "'";
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

// `start --role trainer` of the tiny model on corpus.txt (T = 16) with `config`, to `steps`
// into `out`; callers add the services, keys and recovery flags.
inline std::vector<std::string> tiny_trainer_argv(const std::string& config, const std::string& out,
                                                  int steps) {
  return {"start",
          "--role",
          "trainer",
          "--config",
          config,
          "--model",
          "tiny",
          "--data",
          "corpus.txt",
          "--seq",
          "16",
          "--steps",
          std::to_string(steps),
          "--out",
          out};
}

// The step at which a trainer's log says checkpoint `tag` was published ("checkpoint <tag>
// saved in <dir> (published at step <n>, ..."); -1 when it says none.
inline int published_at_step(const std::string& log, const std::string& tag) {
  const std::string saved = "checkpoint " + tag + " saved in ";
  const size_t at = log.find(saved);
  if (at == std::string::npos) return -1;
  const std::string published = "(published at step ";
  const size_t p = log.find(published, at);
  if (p == std::string::npos || log.find('\n', at) < p) return -1;
  return std::stoi(log.substr(p + published.size()));
}

inline std::string repo_path(const std::string& rel) {
  return std::string(DSACTOR_SOURCE_DIR) + "/" + rel;
}

}  // namespace dsactor::testing
