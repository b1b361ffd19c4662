#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "security/curve_keys.h"

namespace dsactor::cli {

void add_keygen_command(CLI::App& app) {
  struct Args {
    std::string out;
    std::string name = "dsactor";
    bool force = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "keygen",
      "Write a CurveZMQ keypair: <out>/<name>.key (public, hand it to peers) and "
      "<out>/<name>.key_secret (mode 0600)");
  cmd->add_option("--out", a->out, "directory for the key files (created 0700)")->required();
  cmd->add_option("--name", a->name, "file name of the pair")->capture_default_str();
  cmd->add_flag("--force", a->force, "replace an existing secret key");
  cmd->callback([a] {
    const auto keys = security::generate_keypair();
    const auto secret = security::write_keypair(a->out, a->name, keys, a->force);
    std::cout << fmt::format("public key {}\nwrote {} and {}\n", keys.public_key,
                             (std::filesystem::path(a->out) / (a->name + ".key")).string(),
                             secret.string());
  });
}

}  // namespace dsactor::cli
