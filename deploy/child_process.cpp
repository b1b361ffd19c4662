#include "deploy/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <system_error>

extern char** environ;

namespace dsactor::deploy {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text(int e) {
  return std::strerror(e);
}

int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

// Waits until fd is readable or the deadline passes; true when readable.
bool poll_readable(int fd, Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
  }
}

}  // namespace

// An argv[0] without '/' is looked up in PATH before fork, so the child only execve()s.
std::optional<std::string> find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const auto colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  return std::nullopt;
}

namespace {

// Our environment with `extra` added, a name in `extra` replacing ours.
std::vector<std::string> environment_with(
    const std::vector<std::pair<std::string, std::string>>& extra) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string_view kv(*e);
    const std::string_view key = kv.substr(0, kv.find('='));
    const bool replaced =
        std::any_of(extra.begin(), extra.end(), [&](const auto& p) { return p.first == key; });
    if (!replaced) out.emplace_back(kv);
  }
  for (const auto& [k, v] : extra) out.push_back(k + "=" + v);
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

struct Pipe {
  UniqueFd read, write;
};

Pipe make_pipe() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw ChildStartError("pipe: " + errno_text(errno));
  return {UniqueFd(p[0]), UniqueFd(p[1])};
}

UniqueFd open_or_throw(const std::filesystem::path& path, int flags) {
  UniqueFd fd(::open(path.c_str(), flags | O_CLOEXEC, 0644));
  if (!fd)
    throw ChildStartError(fmt::format("cannot open {}: {}", path.string(), errno_text(errno)));
  return fd;
}

// One output stream: the descriptor the child gets and, for a pipe, the end we keep.
struct Stream {
  UniqueFd child_end, our_end;
  bool to_stdout = false;
};

Stream open_output(const Output& o) {
  Stream s;
  switch (o.kind) {
    case Output::Kind::kInherit:
      break;
    case Output::Kind::kNull:
      s.child_end = open_or_throw("/dev/null", O_WRONLY);
      break;
    case Output::Kind::kPipe: {
      Pipe p = make_pipe();
      s.child_end = std::move(p.write);
      s.our_end = std::move(p.read);
      break;
    }
    case Output::Kind::kFile:
      s.child_end = open_or_throw(o.file, O_WRONLY | O_CREAT | O_TRUNC);
      break;
    case Output::Kind::kStdout:
      s.to_stdout = true;
      break;
  }
  return s;
}

// What failed in the child before it ran the program, sent back through the start pipe.
enum class Step : int { kDup = 1, kChdir = 2, kExec = 3 };
struct StartFailure {
  Step step;
  int error;
};

// Everything the child does between fork and the program, prepared before fork.
struct ChildSetup {
  pid_t parent = -1;
  bool own_group = false, die_with_parent = false, default_signals = false;
  int stdin_fd = -1, out_fd = -1, err_fd = -1;
  bool err_to_stdout = false;
  const char* workdir = nullptr;
  int start_pipe = -1;  // write end
};

[[noreturn]] void fail_in_child(int start_pipe, Step step) {
  const StartFailure f{step, errno};
  [[maybe_unused]] auto w = ::write(start_pipe, &f, sizeof(f));
  ::_exit(127);
}

// Runs in the child right after fork: async-signal-safe calls only.
void enter_child(const ChildSetup& s) {
  if (s.own_group) ::setpgid(0, 0);
  if (s.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // The parent may have died between fork and prctl; then nobody would ever stop us.
    if (::getppid() != s.parent) ::_exit(127);
  }
  if (s.default_signals) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) ::signal(sig, SIG_DFL);
  }
  if (s.stdin_fd >= 0 && ::dup2(s.stdin_fd, 0) < 0) fail_in_child(s.start_pipe, Step::kDup);
  if (s.out_fd >= 0 && ::dup2(s.out_fd, 1) < 0) fail_in_child(s.start_pipe, Step::kDup);
  if (s.err_to_stdout && ::dup2(1, 2) < 0) fail_in_child(s.start_pipe, Step::kDup);
  if (s.err_fd >= 0 && ::dup2(s.err_fd, 2) < 0) fail_in_child(s.start_pipe, Step::kDup);
  if (s.workdir && ::chdir(s.workdir) != 0) fail_in_child(s.start_pipe, Step::kChdir);
}

}  // namespace

// The parts of a start both kinds share: streams opened, the fork, the group, the pidfd, and
// the verdict of the start pipe. `in_child` runs in the child after its setup, gets the start
// pipe's write end, and must not return.
ChildProcess ChildProcess::start(const ChildOptions& o, const std::string& what,
                                 const std::function<void(int start_pipe)>& in_child) {
  Stream out = open_output(o.out), err = open_output(o.err);
  UniqueFd null_in;
  if (o.stdin_text) {
    // Written whole before fork: a pipe holds 64 KiB, so this never blocks.
    if (o.stdin_text->size() > 4096) throw ChildStartError("stdin_text: longer than 4096 bytes");
    Pipe in = make_pipe();
    if (::write(in.write.get(), o.stdin_text->data(), o.stdin_text->size()) !=
        static_cast<ssize_t>(o.stdin_text->size()))
      throw ChildStartError("stdin pipe: " + errno_text(errno));
    null_in = std::move(in.read);
  } else if (o.stdin_null) {
    null_in = open_or_throw("/dev/null", O_RDONLY);
  }
  Pipe start_pipe = make_pipe();
  const std::string workdir = o.workdir.string();
  ChildSetup s;
  s.parent = ::getpid();
  s.own_group = o.own_process_group;
  s.die_with_parent = o.die_with_parent;
  s.default_signals = o.default_signals;
  s.stdin_fd = null_in.get();
  s.out_fd = out.child_end.get();
  s.err_fd = err.child_end.get();
  s.err_to_stdout = err.to_stdout;
  s.workdir = workdir.empty() ? nullptr : workdir.c_str();
  s.start_pipe = start_pipe.write.get();

  const pid_t pid = ::fork();
  if (pid < 0) throw ChildStartError("fork: " + errno_text(errno));
  if (pid == 0) {
    enter_child(s);
    in_child(s.start_pipe);
    ::_exit(127);
  }
  // Both sides set the group, so a signal sent right after fork already reaches it.
  if (o.own_process_group) ::setpgid(pid, pid);
  UniqueFd pidfd(pidfd_open(pid));
  const int pidfd_errno = errno;
  start_pipe.write.reset();
  StartFailure f{};
  ssize_t n;
  do n = ::read(start_pipe.read.get(), &f, sizeof(f));
  while (n < 0 && errno == EINTR);
  std::string why;
  if (n == static_cast<ssize_t>(sizeof(f))) {
    if (f.step == Step::kChdir)
      why = fmt::format("cannot enter {}: {}", workdir, errno_text(f.error));
    else if (f.step == Step::kDup)
      why = "dup2: " + errno_text(f.error);
    else
      why = errno_text(f.error);
  } else if (!pidfd) {
    why = "pidfd_open: " + errno_text(pidfd_errno);
    ::kill(pid, SIGKILL);
  }
  if (!why.empty()) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    throw ChildStartError(fmt::format("cannot start {}: {}", what, why));
  }
  ChildProcess c;
  c.pid_ = pid;
  c.own_group_ = o.own_process_group;
  c.pidfd_ = std::move(pidfd);
  c.out_ = std::move(out.our_end);
  c.err_ = std::move(err.our_end);
  return c;
}

ChildProcess ChildProcess::exec(const std::vector<std::string>& argv, const ChildOptions& options) {
  if (argv.empty()) throw ChildStartError("empty command line");
  const auto exe = find_executable(argv[0]);
  if (!exe) throw ChildStartError(fmt::format("cannot start: \"{}\" is not in PATH", argv[0]));
  std::vector<std::string> env_strings = environment_with(options.env);
  std::vector<std::string> argv_strings = argv;
  const std::vector<char*> envp = pointers(env_strings), cargv = pointers(argv_strings);
  return start(options, *exe, [&](int start_pipe) {
    // Descriptors other code opened without O_CLOEXEC (sockets, files) stay ours.
    ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
    ::execve(exe->c_str(), cargv.data(), envp.data());
    fail_in_child(start_pipe, Step::kExec);
  });
}

ChildProcess ChildProcess::fork_call(const std::function<int(int report_fd)>& body,
                                     const ChildOptions& options) {
  Pipe report = make_pipe();
  ChildProcess c = start(options, "a forked call", [&](int start_pipe) {
    ::close(start_pipe);  // the start succeeded: the parent reads end-of-file
    report.read.reset();
    int code = 1;
    try {
      code = body(report.write.get());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "forked call failed: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "forked call failed: unknown exception\n");
    }
    std::fflush(nullptr);
    ::_exit(code);  // no destructors or atexit handlers of the parent's state
  });
  report.write.reset();
  c.report_ = std::move(report.read);
  return c;
}

ChildProcess::ChildProcess(ChildProcess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      own_group_(o.own_group_),
      pidfd_(std::move(o.pidfd_)),
      out_(std::move(o.out_)),
      err_(std::move(o.err_)),
      report_(std::move(o.report_)),
      status_(std::exchange(o.status_, std::nullopt)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    kill_and_reap();
    pid_ = std::exchange(o.pid_, -1);
    own_group_ = o.own_group_;
    pidfd_ = std::move(o.pidfd_);
    out_ = std::move(o.out_);
    err_ = std::move(o.err_);
    report_ = std::move(o.report_);
    status_ = std::exchange(o.status_, std::nullopt);
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  kill_and_reap();
}

void ChildProcess::kill_and_reap() noexcept {
  if (pid_ <= 0 || status_) return;
  signal(SIGKILL);
  try {
    wait();
  } catch (const std::exception&) {
    status_ = 0;  // not ours to reap any more (someone else waited for it)
  }
}

void ChildProcess::on_reaped(int status) {
  status_ = status;
  pidfd_.reset();
  // What the child left behind in its group (a shell's background job) goes with it. The
  // group id stays taken while any member lives, so this cannot reach an unrelated group.
  if (own_group_) ::kill(-pid_, SIGKILL);
}

void ChildProcess::signal(int sig) const {
  // Never pid <= 0: kill(-1) would reach every process we may signal.
  if (pid_ <= 0 || status_) return;
  ::kill(own_group_ ? -pid_ : pid_, sig);
}

std::optional<int> ChildProcess::try_wait() {
  if (status_ || pid_ <= 0) return status_;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) on_reaped(status);
  if (r < 0 && errno != EINTR)
    throw std::system_error(errno, std::generic_category(), fmt::format("waitpid {}", pid_));
  return status_;
}

std::optional<int> ChildProcess::wait_for(std::chrono::milliseconds timeout) {
  if (status_ || pid_ <= 0) return status_;
  if (!poll_readable(pidfd_.get(), Clock::now() + timeout)) return std::nullopt;
  return try_wait();
}

int ChildProcess::wait() {
  while (!status_ && pid_ > 0) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, 0);
    if (r == pid_) on_reaped(status);
    if (r < 0 && errno != EINTR)
      throw std::system_error(errno, std::generic_category(), fmt::format("waitpid {}", pid_));
  }
  return status_.value_or(0);
}

int exit_code(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

std::string signal_name(int sig) {
  if (const char* abbrev = sigabbrev_np(sig)) return fmt::format("SIG{}", abbrev);
  return fmt::format("signal {}", sig);
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       signal_name(WTERMSIG(status)));
  return fmt::format("ended with wait status {}", status);
}

CommandOutput run_and_capture(const std::vector<std::string>& argv) {
  ChildOptions options;
  options.stdin_null = true;
  options.out = Output::pipe();
  options.err = Output::same_as_stdout();
  ChildProcess child = ChildProcess::exec(argv, options);
  const UniqueFd out = child.take_stdout();
  CommandOutput r;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(out.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.output.append(buf, static_cast<size_t>(n));
  }
  r.status = child.wait();
  return r;
}

std::string shell_quote(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) out += ' ';
    const bool plain = !a.empty() && std::all_of(a.begin(), a.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("-_./:=@,+%", ch);
    });
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char ch : a) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    out += '\'';
  }
  return out;
}

bool wait_for_exit(pid_t pid, std::chrono::milliseconds timeout) {
  if (pid <= 0) return true;
  UniqueFd fd(pidfd_open(pid));
  if (!fd) return errno == ESRCH;  // no such process: it is gone
  return poll_readable(fd.get(), Clock::now() + timeout);
}

}  // namespace dsactor::deploy
