#pragma once
// Helpers for the deployment tests: temp dirs, free loopback ports, process liveness, and
// waits on events (a file's text through inotify, a process's exit through a pidfd).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "actors/collectives/job_token.h"
#include "deploy/child_process.h"
#include "deploy/file_watch.h"
#include "security/curve_keys.h"
#include "security/transport_security.h"

namespace dsactor::testing {

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("dsactor_deploy_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

inline std::string read_file(const std::filesystem::path& p) {
  return deploy::read_text(p);
}

// A port the kernel just handed out on 127.0.0.1 (closed again: free unless someone races us).
inline int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

// Alive = exists and is not a zombie (a reparented zombie may wait for init to reap it).
inline bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto paren = all.rfind(')');
  if (paren == std::string::npos || paren + 2 >= all.size()) return false;
  return all[paren + 2] != 'Z' && all[paren + 2] != 'X';
}

// True once `file` contains `text`, woken by each change to the file (inotify).
inline bool wait_for_text(const std::filesystem::path& file, const std::string& text,
                          std::chrono::milliseconds timeout) {
  return deploy::wait_for_file(
      file, [&](const std::string& t) { return t.find(text) != std::string::npos; }, timeout);
}

// The pid a shell child wrote into `file` with `echo $$ > file` (0 when not there yet).
inline pid_t pid_from(const std::filesystem::path& file) {
  std::ifstream in(file);
  long pid = 0;
  in >> pid;
  return static_cast<pid_t>(pid);
}

// Waits (inotify) until a shell child has written its pid into `file`; that pid, or 0 when
// `timeout` passed first.
inline pid_t wait_for_pid(const std::filesystem::path& file, std::chrono::milliseconds timeout) {
  pid_t pid = 0;
  deploy::wait_for_file(
      file,
      [&](const std::string& text) {
        // Complete once the line is: `echo` writes the digits and the newline at once.
        if (text.find('\n') == std::string::npos) return false;
        pid = static_cast<pid_t>(std::atol(text.c_str()));
        return pid > 0;
      },
      timeout);
  return pid;
}

// True once the process `pid` (any process, also one reparented to init) has exited; a
// pidfd wakes the wait.
inline bool wait_gone(pid_t pid, std::chrono::milliseconds timeout) {
  return deploy::wait_for_exit(pid, timeout);
}

// A keypair as `dsactor keygen --out dir --name name` writes it, made on first use; the path
// of its secret file.
inline std::filesystem::path make_keypair(const std::filesystem::path& dir,
                                          const std::string& name) {
  const auto secret = dir / (name + ".key_secret");
  if (!std::filesystem::exists(secret))
    security::write_keypair(dir, name, security::generate_keypair());
  return secret;
}

// A job token file (mode 0600) at `file`, made on first use; its path.
inline std::filesystem::path make_job_token_file(const std::filesystem::path& file) {
  if (!std::filesystem::exists(file))
    actors::write_job_token_file(file, actors::generate_job_token());
  return file;
}

// A client of a keyed server: the keypair `secret` and the server's public key file.
inline security::ClientSecurity client_keys(const std::filesystem::path& secret,
                                            const std::filesystem::path& server_public) {
  security::ClientSecurity c;
  c.keys = security::read_secret_key_file(secret);
  c.server_key = security::read_public_key_file(server_public);
  return c;
}

// The flags of trainers started by hand that share one keypair (rank 0 serves the
// rendezvous with it, and admits its own key) and one job token, made under `dir` once.
inline std::vector<std::string> shared_trainer_keys(const std::filesystem::path& dir) {
  const auto secret = make_keypair(dir / "keys", "job");
  return {"--secret-key",      secret.string(),
          "--coordinator-key", (dir / "keys" / "job.key").string(),
          "--job-token-file",  make_job_token_file(dir / "job.token").string()};
}

}  // namespace dsactor::testing
