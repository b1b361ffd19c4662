#pragma once
// `dsactor launch --launcher openmpi|slurm`: one mpirun or srun command starts every rank,
// and the trainer reads its rank from OMPI_COMM_WORLD_* or SLURM_* (deploy/launch_env.h).
//
//   openmpi: mpirun -n W -H host1:n1,host2:n2 -wdir WORKDIR -x NAME=VALUE ... -x MASTER_ADDR=A
//            -x MASTER_PORT=P BINARY start --role trainer ARGS
//   slurm:   srun -n W --nodes N --nodelist host1,host2 --chdir WORKDIR
//            --export=ALL,NAME=VALUE,...,MASTER_ADDR=A,MASTER_PORT=P BINARY start --role trainer
//            ARGS
// The program may carry arguments ($DSACTOR_LAUNCH_MPIRUN, $DSACTOR_LAUNCH_SRUN, e.g.
// "mpirun --mca btl_tcp_if_include eth0"). Both place ranks by count per host, so a slot
// selection other than a host's leading slots (--include host:1,3) is refused: it needs
// per-host CUDA_VISIBLE_DEVICES, which the ssh and pdsh launchers set. srun's environment
// list is comma-separated, so a value holding a comma is refused.
// With token_in_env the run's token is in the launcher's environment: mpirun gets
// `-x DSACTOR_JOB_TOKEN` (the name only), srun passes it with --export=ALL.
#include <string>
#include <vector>

#include "deploy/launcher.h"

namespace dsactor::deploy {

enum class BatchLauncher { kOpenMpi, kSlurm };

// The one command line; throws LaunchConfigError as above, or for trainer args that set
// --rank/--world-size.
std::vector<std::string> plan_batch_launch(BatchLauncher launcher,
                                           const std::vector<SelectedHost>& hosts,
                                           const LaunchPlanOptions& options,
                                           std::vector<std::string> program);

}  // namespace dsactor::deploy
