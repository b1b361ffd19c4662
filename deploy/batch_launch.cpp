#include "deploy/batch_launch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dsactor::deploy {

std::vector<std::string> plan_batch_launch(BatchLauncher launcher,
                                           const std::vector<SelectedHost>& hosts,
                                           const LaunchPlanOptions& o,
                                           std::vector<std::string> argv) {
  const char* name = launcher == BatchLauncher::kOpenMpi ? "openmpi" : "slurm";
  if (hosts.empty()) throw LaunchConfigError("dsactor launch: the hostfile lists no hosts");
  check_trainer_args(o.trainer_args);
  int world = 0;
  std::vector<std::string> placement, names;
  for (const auto& h : hosts) {
    if (!h.leading_slots)
      throw LaunchConfigError(fmt::format(
          "dsactor launch: --launcher {} places ranks by count per host and cannot choose "
          "slots {} of host '{}'; select leading slots (host:0,1) or use --launcher ssh|pdsh",
          name, fmt::join(h.slots, ","), h.host));
    world += static_cast<int>(h.slots.size());
    placement.push_back(fmt::format("{}:{}", h.host, h.slots.size()));
    names.push_back(h.host);
  }
  const std::string master = o.master_addr.empty() ? hosts.front().host : o.master_addr;
  EnvAssignments env = o.exports;
  env.emplace_back("MASTER_ADDR", master);
  env.emplace_back("MASTER_PORT", std::to_string(o.master_port));

  if (launcher == BatchLauncher::kOpenMpi) {
    if (argv.empty()) argv = {"mpirun"};
    argv.insert(argv.end(), {"-n", std::to_string(world), "-H",
                             fmt::format("{}", fmt::join(placement, ",")), "-wdir", o.workdir});
    for (const auto& [n, v] : env) argv.insert(argv.end(), {"-x", n + "=" + v});
    // By name only: mpirun passes its own value on, which is in no argv.
    if (o.token_in_env) argv.insert(argv.end(), {"-x", "DSACTOR_JOB_TOKEN"});
  } else {
    if (argv.empty()) argv = {"srun"};
    std::string exports = "--export=ALL";
    for (const auto& [n, v] : env) {
      if (v.find(',') != std::string::npos)
        throw LaunchConfigError(fmt::format(
            "dsactor launch: --launcher slurm passes the environment as srun's comma-separated "
            "--export list, and {}'s value \"{}\" holds a comma; use --launcher ssh or pdsh",
            n, v));
      exports += "," + n + "=" + v;
    }
    argv.insert(argv.end(),
                {"-n", std::to_string(world), "--nodes", std::to_string(hosts.size()), "--nodelist",
                 fmt::format("{}", fmt::join(names, ",")), "--chdir", o.workdir, exports});
  }
  argv.insert(argv.end(), {o.binary, "start", "--role", "trainer"});
  argv.insert(argv.end(), o.trainer_args.begin(), o.trainer_args.end());
  return argv;
}

}  // namespace dsactor::deploy
