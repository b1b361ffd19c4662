#pragma once
// The keys and the token of one run of a deployment (docs/security.md). Before it starts
// anything, `dsactor up` makes the keypairs the roles lack and writes each server's
// allow-list, so the default run is authenticated without a step by hand; `up --make-keys`
// does only this, for keys that are then copied to other machines.
#include <filesystem>
#include <string>

#include "deploy/deploy_config.h"

namespace dsactor::deploy {

// For every role whose key files are resolved: a fresh keypair where its secret key is
// missing (never for a role that names its own, roles[].secret_key: that must exist), and
// each server's default allow-list (<keys_dir>/<name>.authorized): the public keys of the
// roles that connect to it (DeployConfig::clients_of) and its own, one per line, mode 0600.
// Then every key file a role will be given is read once, so a bad one fails here, naming the
// role. Throws DeployConfigError.
void make_run_keys(const DeployConfig& config);

// The run's job token: security.job_token_file's, or a fresh one. With `create_file`, a
// job_token_file that does not exist yet is written (0600) with a fresh token first.
std::string run_job_token(const DeployConfig& config, bool create_file = false);

// A fresh directory (mode 0700, under $XDG_RUNTIME_DIR or the temp directory) for one run's
// keys; removed with everything in it by the destructor.
class RunKeysDir {
 public:
  RunKeysDir();
  ~RunKeysDir();
  RunKeysDir(const RunKeysDir&) = delete;
  RunKeysDir& operator=(const RunKeysDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace dsactor::deploy
