#include "deploy/file_watch.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>
#include <system_error>

#include "deploy/child_process.h"

namespace dsactor::deploy {

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool wait_for_file(const std::filesystem::path& file,
                   const std::function<bool(const std::string& text)>& done,
                   std::chrono::milliseconds timeout, int stop_fd) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  UniqueFd watch(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  if (!watch) throw std::system_error(errno, std::generic_category(), "inotify_init1");
  // The directory, not the file: the file may not exist yet, or be replaced by a rename.
  const std::filesystem::path dir = file.has_parent_path() ? file.parent_path() : ".";
  if (::inotify_add_watch(watch.get(), dir.c_str(),
                          IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO) < 0)
    throw std::system_error(errno, std::generic_category(), "inotify_add_watch " + dir.string());
  // Watching began before this first look, so no change after it goes unnoticed.
  if (done(read_text(file))) return true;
  const std::string name = file.filename().string();
  alignas(inotify_event) char events[16 * 1024];
  while (true) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd fds[2] = {{watch.get(), POLLIN, 0}, {stop_fd, POLLIN, 0}};
    const int rc = ::poll(fds, stop_fd >= 0 ? 2 : 1, static_cast<int>(left.count()));
    if (rc < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
    if (rc <= 0) continue;
    if (stop_fd >= 0 && fds[1].revents) return done(read_text(file));
    bool ours = false;
    for (ssize_t n; (n = ::read(watch.get(), events, sizeof(events))) > 0;) {
      for (char* p = events; p < events + n;) {
        const auto* e = reinterpret_cast<const inotify_event*>(p);
        // An overflowed queue may have dropped ours: look again.
        if ((e->mask & IN_Q_OVERFLOW) || (e->len > 0 && name == e->name)) ours = true;
        p += sizeof(inotify_event) + e->len;
      }
    }
    if (ours && done(read_text(file))) return true;
  }
}

}  // namespace dsactor::deploy
