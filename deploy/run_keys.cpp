#include "deploy/run_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "actors/collectives/job_token.h"
#include "security/curve_keys.h"

namespace dsactor::deploy {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const DeployConfig& config, const RoleSpec& r, const std::string& what) {
  throw DeployConfigError(
      fmt::format("{}: roles[{}] \"{}\": {}", config.source.string(), r.index, r.name, what));
}

void write_private_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    throw DeployConfigError(
        fmt::format("{}: cannot create: {}", tmp.string(), std::strerror(errno)));
  ::fchmod(fd, 0600);
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw DeployConfigError(
        fmt::format("{}: cannot write: {}", path.string(), std::strerror(errno)));
  }
}

bool is_default_allow_list(const DeployConfig& config, const RoleSpec& r) {
  return r.authorized_keys == config.security.keys_dir / (r.name + ".authorized");
}

void make_keypair(const DeployConfig& config, const RoleSpec& r) {
  if (r.secret_key.empty() || fs::exists(r.secret_key)) return;
  if (r.own_key_files)
    fail(config, r,
         fmt::format("secret_key {} does not exist (make it with `dsactor keygen`)",
                     r.secret_key.string()));
  std::string name = r.secret_key.filename().string();
  name = name.substr(0, name.size() - std::string(".key_secret").size());
  security::write_keypair(r.secret_key.parent_path(), name, security::generate_keypair());
}

// A role's public key: its public_key file, else its secret key's public half.
std::string public_key_of(const RoleSpec& r) {
  return security::read_public_key_file(fs::exists(r.public_key) ? r.public_key : r.secret_key);
}

void write_allow_list(const DeployConfig& config, const RoleSpec& server) {
  std::string text = fmt::format("# clients of {} in {} (written by dsactor up)\n", server.name,
                                 config.source.string());
  text += fmt::format("{} {}\n", public_key_of(server), server.name);
  for (const RoleSpec* c : config.clients_of(server))
    if (c != &server) text += fmt::format("{} {}\n", public_key_of(*c), c->name);
  write_private_file(server.authorized_keys, text);
}

// Every file a role is given, read as the role will read it.
void check_key_files(const DeployConfig& config, const RoleSpec& r) {
  try {
    security::read_secret_key_file(r.secret_key);
    if (config.is_server(r)) {
      security::read_public_key_file(r.public_key);
      security::read_authorized_keys(r.authorized_keys);
    }
  } catch (const security::KeyFileError& e) {
    fail(config, r, e.what());
  }
}

}  // namespace

void make_run_keys(const DeployConfig& config) {
  if (config.security.insecure) return;
  const fs::path& dir = config.security.keys_dir;
  if (dir.empty()) return;
  if (!fs::exists(dir)) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
      throw DeployConfigError(
          fmt::format("security.keys_dir {}: cannot create: {}", dir.string(), ec.message()));
    ::chmod(dir.c_str(), 0700);
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
    spdlog::warn("security.keys_dir {}: mode {:04o} lets others list the keys; chmod 700 it",
                 dir.string(), st.st_mode & 07777);
  try {
    for (const auto& r : config.roles) make_keypair(config, r);
    for (const auto& r : config.roles)
      if (config.is_server(r) && is_default_allow_list(config, r)) write_allow_list(config, r);
  } catch (const security::KeyFileError& e) {
    throw DeployConfigError(e.what());
  }
  for (const auto& r : config.roles) check_key_files(config, r);
}

std::string run_job_token(const DeployConfig& config, bool create_file) {
  const fs::path& file = config.security.job_token_file;
  try {
    if (file.empty()) return actors::generate_job_token();
    if (create_file && !fs::exists(file)) {
      const std::string token = actors::generate_job_token();
      actors::write_job_token_file(file, token);
      return token;
    }
    return actors::read_job_token_file(file);
  } catch (const actors::JobTokenError& e) {
    throw DeployConfigError(fmt::format("security.job_token_file: {}", e.what()));
  }
}

RunKeysDir::RunKeysDir() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  const fs::path base =
      runtime && fs::is_directory(runtime) ? fs::path(runtime) : fs::temp_directory_path();
  std::string templ = (base / "dsactor-keys-XXXXXX").string();
  if (!::mkdtemp(templ.data()))  // mode 0700
    throw DeployConfigError(fmt::format("cannot create a directory for the run's keys in {}: {}",
                                        base.string(), std::strerror(errno)));
  path_ = templ;
}

RunKeysDir::~RunKeysDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

}  // namespace dsactor::deploy
