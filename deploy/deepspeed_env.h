#pragma once
// The environment a launch exports to every rank, as DeepSpeed's runner does:
//   - every NAME=VALUE line of `.deepspeed_env` (the name $DS_ENV_FILE overrides) in the
//     home directory, then in the current directory (a later line overrides an earlier one);
//   - the launching shell's variables whose names start with NCCL, UCX or MV2 (DeepSpeed's
//     list less its Python-only entries), and DSACTOR_LOG.
// Blank lines and lines starting with '#' are skipped (DeepSpeed would fail on them).
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "deploy/launch_env.h"

namespace dsactor::deploy {

using EnvAssignments = std::vector<std::pair<std::string, std::string>>;

// Reads one env file; throws LaunchConfigError naming file and line for a line that is not
// NAME=VALUE with NAME a shell variable name.
EnvAssignments read_env_file(const std::filesystem::path& path);

// What every rank gets: the env files of `dirs` (home, then current directory, when they
// exist), then the exported prefixes from `env`. Each name once, the last value winning.
EnvAssignments launch_exports(const std::vector<std::filesystem::path>& dirs, const EnvLookup& env,
                              const std::vector<std::string>& environ_names);

// The directories DeepSpeed looks in, and the names of this process's environment.
std::vector<std::filesystem::path> deepspeed_env_dirs();
std::vector<std::string> process_env_names();

}  // namespace dsactor::deploy
