#pragma once
// Running the reference tools a bench compares against (fio, node) as child processes.
#include <filesystem>
#include <optional>
#include <string>

namespace dsactor::bench {

// The first executable named `exe` in $PATH.
std::optional<std::filesystem::path> find_on_path(const std::string& exe);

// `s` in single quotes for /bin/sh.
std::string shell_quote(const std::string& s);

struct CommandResult {
  int status = -1;  // as pclose returns it: 0 on success
  std::string out;  // stdout and stderr together
};
CommandResult run_command(const std::string& cmd);

}  // namespace dsactor::bench
