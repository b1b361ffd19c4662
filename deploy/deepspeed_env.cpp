#include "deploy/deepspeed_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>

extern char** environ;

namespace dsactor::deploy {

namespace {

bool is_variable_name(const std::string& n) {
  if (n.empty() || std::isdigit(static_cast<unsigned char>(n[0]))) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

void assign(EnvAssignments& out, std::string name, std::string value) {
  for (auto& [n, v] : out)
    if (n == name) {
      v = std::move(value);
      return;
    }
  out.emplace_back(std::move(name), std::move(value));
}

std::string env_file_name() {
  const char* name = std::getenv("DS_ENV_FILE");
  return name && *name ? name : ".deepspeed_env";
}

}  // namespace

EnvAssignments read_env_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw LaunchConfigError(fmt::format("cannot read env file '{}'", path.string()));
  EnvAssignments out;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const auto eq = line.find('=');
    const std::string name = eq == std::string::npos ? line : line.substr(0, eq);
    if (eq == std::string::npos || !is_variable_name(name))
      throw LaunchConfigError(
          fmt::format("{}:{}: expected NAME=VALUE (NAME a shell variable name), got '{}'",
                      path.string(), line_no, line));
    assign(out, name, line.substr(eq + 1));
  }
  return out;
}

EnvAssignments launch_exports(const std::vector<std::filesystem::path>& dirs, const EnvLookup& env,
                              const std::vector<std::string>& names) {
  EnvAssignments out;
  for (const auto& n : names) {
    const bool exported =
        n.starts_with("NCCL") || n.starts_with("UCX") || n.starts_with("MV2") || n == "DSACTOR_LOG";
    if (!exported) continue;
    if (auto v = env(n)) assign(out, n, *v);
  }
  // The files come last: what a user wrote for the ranks beats the launching shell.
  for (const auto& dir : dirs) {
    const auto path = dir / env_file_name();
    if (!std::filesystem::is_regular_file(path)) continue;
    for (auto& [n, v] : read_env_file(path)) assign(out, n, v);
  }
  return out;
}

std::vector<std::filesystem::path> deepspeed_env_dirs() {
  std::vector<std::filesystem::path> dirs;
  if (const char* home = std::getenv("HOME"); home && *home) dirs.emplace_back(home);
  std::error_code ec;
  const auto cwd = std::filesystem::current_path(ec);
  if (!ec && (dirs.empty() || !std::filesystem::equivalent(dirs.front(), cwd, ec)))
    dirs.push_back(cwd);
  return dirs;
}

std::vector<std::string> process_env_names() {
  std::vector<std::string> names;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    names.push_back(kv.substr(0, kv.find('=')));
  }
  return names;
}

}  // namespace dsactor::deploy
