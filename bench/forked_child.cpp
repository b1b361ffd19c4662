#include "bench/forked_child.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>

namespace dsactor::bench {

std::map<std::string, size_t> proc_status_snapshot() {
  std::ifstream in("/proc/self/status");
  std::map<std::string, size_t> out;
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos || line.find(" kB", colon) == std::string::npos) continue;
    out[line.substr(0, colon)] = std::stoull(line.substr(colon + 1)) * 1024;
  }
  return out;
}

size_t proc_status_bytes(const char* field) {
  const auto status = proc_status_snapshot();
  const auto it = status.find(field);
  return it == status.end() ? 0 : it->second;
}

ForkedChild::ForkedChild(std::string name, const std::function<nlohmann::json()>& phase)
    : name_(std::move(name)) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("bench: pipe failed");
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("bench: fork failed");
  if (pid_ == 0) {
    close(fds[0]);
    nlohmann::json j;
    int code = 0;
    try {
      j = phase();
    } catch (const std::exception& e) {
      j = {{"error", e.what()}};
      code = 1;
    }
    const std::string s = j.dump();
    for (size_t off = 0; off < s.size();) {
      const ssize_t n = write(fds[1], s.data() + off, s.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    close(fds[1]);
    _exit(code);  // no destructors or atexit handlers of the parent's state
  }
  close(fds[1]);
  read_fd_ = fds[0];
}

ForkedChild::~ForkedChild() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (read_fd_ >= 0) close(read_fd_);
}

nlohmann::json ForkedChild::result() {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(read_fd_, buf, sizeof buf)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  close(read_fd_);
  read_fd_ = -1;
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  if (out.empty()) throw std::runtime_error("bench: phase " + name_ + " died");
  auto j = nlohmann::json::parse(out);
  if (j.contains("error"))
    throw std::runtime_error("bench: phase " + name_ + ": " + j["error"].get<std::string>());
  return j;
}

}  // namespace dsactor::bench
