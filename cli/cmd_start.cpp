#include <stdexcept>
#include <string>

#include "cli/commands.h"

namespace dsactor::cli {

void add_start_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("start", "run one role of a deployment (offload, trainer)");
  auto role = std::make_shared<std::string>();
  cmd->add_option("--role", *role, "offload | trainer")->required();
  cmd->callback([role] {
    throw std::runtime_error("not implemented: dsactor start --role " + *role +
                             " (the offload service and the service-driven trainer are being built)");
  });
}

}  // namespace dsactor::cli
