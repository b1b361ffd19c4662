#pragma once
// `dsactor launch`: DeepSpeed-style multi-host start of trainers from a hostfile. This file
// only plans the commands (pure, testable); cli/cmd_launch.cpp runs them as children of a
// Supervisor (parallel, `[rank r@host]` log prefixes, one failure stops the rest).
//
// Ranks are laid out host by host in hostfile order: host i's slot s gets
// rank = (slots of the hosts before it) + s and local_rank = s; world size = all slots.
// Each rank is one remote-shell command that runs, on its host,
//   cd <workdir> && env [EXPORTS] [CUDA_VISIBLE_DEVICES=..] RANK=r WORLD_SIZE=W LOCAL_RANK=l
//     MASTER_ADDR=A MASTER_PORT=P <binary> start --role trainer <trainer args>   (one line)
// EXPORTS are deploy/deepspeed_env.h's (.deepspeed_env and NCCL*/UCX* of the launching shell).
// (the trainer reads its rank from these variables; actors/launch_env.h). With
// token_on_stdin the command first reads one line of stdin into DSACTOR_JOB_TOKEN,
//   IFS= read -r DSACTOR_JOB_TOKEN && export DSACTOR_JOB_TOKEN && cd <workdir> && ...
// so the run's token reaches the trainer through ssh's stdin, never in an argv (which other
// users of either host can read). The command is one
// argument to the transport, quoted for the remote `sh`:
//   ssh:  <DSACTOR_LAUNCH_SSH, default "ssh"> HOST 'COMMAND'
//   pdsh: <DSACTOR_LAUNCH_PDSH, default "pdsh"> -S -w HOST 'COMMAND'   (one pdsh per rank, so
//         every rank has its own exit status and log prefix; -S returns the remote status)
// The transport program may carry arguments ("ssh -p 2222"): split at spaces, no quoting.
// Stopping a launch signals the local transport processes; as with DeepSpeed's pdsh runner,
// whether the remote process dies with its ssh session depends on the remote side.
#include <string>
#include <string_view>
#include <vector>

#include "deploy/deepspeed_env.h"
#include "deploy/host_selection.h"
#include "deploy/launch_env.h"

namespace dsactor::deploy {

enum class LaunchTransport { kSsh, kPdsh };

struct LaunchPlanOptions {
  LaunchTransport transport = LaunchTransport::kSsh;
  std::vector<std::string> transport_command;  // program (+ args); empty: "ssh" / "pdsh"
  std::string master_addr;                     // empty: the hostfile's first host
  int master_port = 29500;
  std::string workdir;  // `cd` here on every host (absolute; normally the launch's cwd)
  std::string binary;   // the dsactor binary on every host (absolute)
  std::vector<std::string> trainer_args;  // appended to `start --role trainer`
  EnvAssignments exports;       // set on every rank before its own variables (.deepspeed_env)
  bool token_on_stdin = false;  // ssh/pdsh: the remote shell reads DSACTOR_JOB_TOKEN first
  // mpirun/srun: DSACTOR_JOB_TOKEN is in the launcher's environment; mpirun is told to pass
  // it on by name (`-x DSACTOR_JOB_TOKEN`), srun passes its whole environment.
  bool token_in_env = false;
};

struct RankCommand {
  int rank = 0;
  int local_rank = 0;
  std::string host;
  std::string remote_command;     // what the host's shell runs
  std::vector<std::string> argv;  // the local transport process
};

// One command per rank, in rank order. Throws LaunchConfigError when the trainer args set
// --rank/--world-size themselves (the launch's environment decides those), or the port is
// not in 1..65535.
std::vector<RankCommand> plan_launch(const std::vector<HostSlots>& hosts,
                                     const LaunchPlanOptions& options);
// The same over the slots a HostFilter selected: local ranks count 0.. over a host's selected
// slots, and a host whose selection is not its leading slots gets CUDA_VISIBLE_DEVICES=<slots>.
std::vector<RankCommand> plan_launch_on(const std::vector<SelectedHost>& hosts,
                                        const LaunchPlanOptions& options);

// Throws LaunchConfigError when `args` set --rank or --world-size (the launch decides them).
void check_trainer_args(const std::vector<std::string>& args);

// Whether `args` hold `flag` ("--x" or "--x=value").
bool has_flag(const std::vector<std::string>& args, std::string_view flag);

// "ssh -p 2222" -> {"ssh", "-p", "2222"}: split at runs of spaces and tabs.
std::vector<std::string> split_words(std::string_view text);

}  // namespace dsactor::deploy
