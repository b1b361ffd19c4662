#pragma once

// Where a trainer learns its rank: the environment the usual launchers set, or a
// DeepSpeed-style hostfile for `dsactor launch`.
//
// Precedence (the first style whose rank variable is set wins; the others are ignored):
//   1. torchrun / explicit: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
//      Checked first because a user who sets RANK by hand, or torchrun running inside an
//      srun/mpirun allocation, means it over the outer launcher's variables.
//   2. Open MPI (mpirun): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//      OMPI_COMM_WORLD_LOCAL_RANK. Before Slurm because mpirun inside an salloc/sbatch
//      allocation inherits the batch step's SLURM_PROCID=0, which is not this rank.
//   3. Slurm (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.
// Within a style, the rank and world-size variables are required together. LOCAL_RANK
// defaults to RANK when absent (single-host use); the MPI and Slurm local ranks are
// required. MASTER_ADDR / MASTER_PORT override every style's master; otherwise Slurm uses
// SLURM_LAUNCH_NODE_IPADDR, and the address defaults to 127.0.0.1 and the port to 29500
// (torchrun's default).

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dsactor::deploy {

// An environment variable or hostfile line is inconsistent or not a number; the message
// names the variable (or file and line) and the value.
class LaunchConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source;  // "torchrun", "openmpi" or "slurm": which variables were used
};

// Looks a variable up; std::nullopt when unset. Tests pass a map instead of the process
// environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// getenv(3): the process environment.
std::optional<std::string> process_env(const std::string& name);

// The launch the environment describes, or std::nullopt when no launcher variables are set
// (a single process not started by a launcher). Throws LaunchConfigError on invalid or
// inconsistent values (non-numeric, negative, rank >= world size, half a style set).
std::optional<LaunchInfo> launch_info_from_env(const EnvLookup& env = process_env);

// One `host slots=N` line of a DeepSpeed hostfile.
struct HostSlots {
  std::string host;
  int slots = 0;
};

// Parses a DeepSpeed hostfile: one `hostname slots=N` per line, `#` starts a comment (whole
// line or trailing), blank lines are skipped. Hosts keep the file's order (ranks are laid
// out host by host in that order). Errors (LaunchConfigError) name the file and line: a
// line that is not `host slots=N`, N not a positive integer, a host listed twice, or a
// file without hosts.
std::vector<HostSlots> parse_hostfile(const std::string& path);
// The same from text; `source_name` is used in error messages.
std::vector<HostSlots> parse_hostfile_text(const std::string& text,
                                           const std::string& source_name = "hostfile");

}  // namespace dsactor::deploy
