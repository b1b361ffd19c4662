#include "deploy/supervisor.h"

#include "deploy/child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>

namespace dsactor::deploy {

namespace {

using Clock = std::chrono::steady_clock;

// A line longer than this is emitted in pieces rather than buffered without bound.
constexpr size_t kMaxLine = 64 * 1024;
// pump() without a deadline: output, exits (pidfds) and stop requests all wake it.
constexpr auto kNoDeadline = Clock::duration::max();

std::string errno_text(int e) {
  return std::strerror(e);
}

// Connects once to a tcp:// or ipc:// endpoint; true when something accepts.
bool try_connect(const std::string& endpoint) {
  if (endpoint.starts_with("ipc://")) {
    const std::string path = endpoint.substr(6);
    sockaddr_un addr{};
    if (path.size() >= sizeof(addr.sun_path)) return false;
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    return s && ::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  if (!endpoint.starts_with("tcp://")) return false;
  const std::string rest = endpoint.substr(6);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  // A wildcard bind answers on loopback.
  if (host == "*" || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return false;
  bool ok = false;
  for (addrinfo* ai = res; ai && !ok; ai = ai->ai_next) {
    UniqueFd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s) continue;
    // A remote host that drops SYNs must not stall the loop.
    timeval tv{0, 200000};
    ::setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    ok = ::connect(s.get(), ai->ai_addr, ai->ai_addrlen) == 0;
  }
  ::freeaddrinfo(res);
  return ok;
}

struct Child {
  const ChildSpec* spec = nullptr;
  std::vector<std::string> argv;  // the spec's, or its restart_argv's since a restart
  int restarts = 0;               // after failures of this child
  ChildProcess process;           // its own process group, killed with the supervisor
  UniqueFd out, err;
  std::string out_buf, err_buf;
  std::deque<std::string> tail;
  bool spawned = false, ready = false, exited = false;
  int status = 0;
  Clock::time_point started, next_probe, term_deadline;
  bool term_sent = false, kill_sent = false;

  bool alive() const { return spawned && !exited; }
  // Failed: a worker that exited non-zero or of a signal, a service that ended at all.
  bool failed() const {
    if (!exited) return false;
    return spec->service || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  // As before its first spawn, for a restart with `new_argv`; the process was reaped.
  void reset(std::vector<std::string> new_argv) {
    argv = std::move(new_argv);
    process = ChildProcess();
    out.reset();
    err.reset();
    out_buf.clear();
    err_buf.clear();
    tail.clear();
    spawned = ready = exited = term_sent = kill_sent = false;
    status = 0;
  }
};

// The write end of the self-pipe of the one run() that handles stop signals. A signal handler
// can reach nothing else, so this is the single piece of mutable global state here; run()
// claims it and gives it back.
std::atomic<int>& signal_pipe() {
  static std::atomic<int> fd{-1};
  return fd;
}

void on_stop_signal(int sig) {
  const int saved = errno;
  const int fd = signal_pipe().load();
  const auto b = static_cast<unsigned char>(sig);
  if (fd >= 0) {
    [[maybe_unused]] auto w = ::write(fd, &b, 1);
  }
  errno = saved;
}

// Installs on_stop_signal for the run's duration and restores the old handlers after it.
class SignalScope {
 public:
  SignalScope(const std::vector<int>& signals, int pipe_fd) : signals_(signals) {
    if (signals_.empty()) return;
    int expected = -1;
    if (!signal_pipe().compare_exchange_strong(expected, pipe_fd))
      throw std::logic_error("Supervisor: another run already handles stop signals");
    old_.resize(signals_.size());
    for (size_t i = 0; i < signals_.size(); ++i) {
      struct sigaction sa {};
      sa.sa_handler = on_stop_signal;
      sigemptyset(&sa.sa_mask);
      ::sigaction(signals_[i], &sa, &old_[i]);
      // A signal ignored when we started stays ignored (nohup's SIGHUP, SIGINT of a shell's
      // background job), as shells and daemons do.
      if (old_[i].sa_handler == SIG_IGN) ::sigaction(signals_[i], &old_[i], nullptr);
    }
    // Unblock them here in case the caller had blocked them (a handler must run).
    sigset_t set;
    sigemptyset(&set);
    for (int s : signals_) sigaddset(&set, s);
    ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  }
  ~SignalScope() {
    if (signals_.empty()) return;
    for (size_t i = 0; i < signals_.size(); ++i) ::sigaction(signals_[i], &old_[i], nullptr);
    signal_pipe().store(-1);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> old_;
};

}  // namespace

struct Supervisor::Impl {
  std::vector<ChildSpec> specs;
  SupervisorOptions opt;
  std::vector<Child> kids;
  // Self-pipe: request_stop() writes 0, the stop-signal handler writes the signal number.
  UniqueFd stop_read, stop_write;
  int stop_code = 0;  // 128 + signal once a stop was requested
  bool ran = false;

  void emit(Child& c, bool is_err, std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::string prefixed = fmt::format("[{}] {}", c.spec->name, line);
    if (opt.sink) {
      opt.sink(prefixed);
    } else {
      std::fwrite(prefixed.data(), 1, prefixed.size(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    }
    if (is_err) {
      c.tail.emplace_back(line);
      while (c.tail.size() > opt.tail_lines) c.tail.pop_front();
    }
    if (c.spec->service && !c.ready && !c.spec->ready_endpoint.empty() &&
        line.find("listening on " + c.spec->ready_endpoint) != std::string_view::npos)
      mark_ready(c, "its log says it listens");
  }

  void mark_ready(Child& c, std::string_view how) {
    c.ready = true;
    const double secs = std::chrono::duration<double>(Clock::now() - c.started).count();
    spdlog::info("{} is ready on {} after {:.2f} s ({})", c.spec->name, c.spec->ready_endpoint,
                 secs, how);
  }

  // Reads what a pipe has now; closes it at EOF (emitting a last unterminated line).
  void drain(Child& c, bool is_err) {
    UniqueFd& fd = is_err ? c.err : c.out;
    std::string& buf = is_err ? c.err_buf : c.out_buf;
    char chunk[16384];
    while (fd) {
      const ssize_t n = ::read(fd.get(), chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) {
        if (!buf.empty()) emit(c, is_err, buf);
        buf.clear();
        fd.reset();
        break;
      }
      buf.append(chunk, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1)
        emit(c, is_err, std::string_view(buf).substr(start, nl - start));
      buf.erase(0, start);
      if (buf.size() > kMaxLine) {
        emit(c, is_err, buf);
        buf.clear();
      }
    }
  }

  void spawn(Child& c) {
    const ChildSpec& s = *c.spec;
    c.started = Clock::now();
    c.next_probe = c.started;
    c.spawned = true;
    ChildOptions options;
    options.env = s.env;
    options.stdin_null = true;
    options.stdin_text = s.stdin_text;
    options.out = Output::pipe();
    options.err = Output::pipe();
    options.own_process_group = true;
    options.die_with_parent = true;
    options.default_signals = true;
    try {
      c.process = ChildProcess::exec(c.argv, options);
    } catch (const ChildStartError& e) {
      // Reported like a child that exited with 127, the shell's "cannot execute".
      c.exited = true;
      c.status = 127 << 8;
      c.tail.emplace_back(e.what());
      spdlog::error("{}: {}", s.name, e.what());
      return;
    }
    c.out = c.process.take_stdout();
    c.err = c.process.take_stderr();
    ::fcntl(c.out.get(), F_SETFL, O_NONBLOCK);
    ::fcntl(c.err.get(), F_SETFL, O_NONBLOCK);
    spdlog::info("started {} (pid {}): {}", s.name, c.process.pid(), shell_quote(c.argv));
  }

  // Signals the child's whole process group (nothing once it was reaped).
  static void signal_group(const Child& c, int sig) { c.process.signal(sig); }

  // The child has been reaped (ChildProcess kills what it left in its group, a shell's
  // background job); read what its pipes still hold.
  void reaped(Child& c, int status) {
    c.exited = true;
    c.status = status;
    drain(c, false);
    drain(c, true);
  }

  // One wait for output, exits, stop requests; at most `max_wait` (kNoDeadline: no limit).
  void pump(Clock::duration max_wait) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, bool>> owners;
    for (auto& c : kids) {
      if (c.out) {
        fds.push_back({c.out.get(), POLLIN, 0});
        owners.emplace_back(&c, false);
      }
      if (c.err) {
        fds.push_back({c.err.get(), POLLIN, 0});
        owners.emplace_back(&c, true);
      }
    }
    const size_t n_child_fds = fds.size();
    fds.push_back({stop_read.get(), POLLIN, 0});
    // Exits wake the poll too: each live child's pidfd becomes readable when it ends.
    for (auto& c : kids)
      if (c.alive()) fds.push_back({c.process.pidfd(), POLLIN, 0});
    int wait_ms = -1;
    if (max_wait != kNoDeadline) {
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(max_wait).count();
      wait_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, std::numeric_limits<int>::max()));
    }
    const int rc = ::poll(fds.data(), fds.size(), wait_ms);
    if (rc < 0 && errno != EINTR)
      throw std::runtime_error("supervisor: poll: " + errno_text(errno));
    if (rc > 0) {
      for (size_t i = 0; i < n_child_fds; ++i)
        if (fds[i].revents) drain(*owners[i].first, owners[i].second);
      if (fds[n_child_fds].revents) {
        unsigned char b[64];
        ssize_t n;
        while ((n = ::read(stop_read.get(), b, sizeof(b))) > 0)
          for (ssize_t i = 0; i < n; ++i) {
            if (b[i] == 0)
              on_stop_request(128 + SIGTERM, "stop requested");
            else
              on_stop_request(128 + b[i], signal_name(b[i]) + " received");
          }
      }
    }
    for (auto& c : kids) {
      if (!c.alive()) continue;
      if (const auto status = c.process.try_wait()) reaped(c, *status);
    }
  }

  void on_stop_request(int code, const std::string& why) {
    if (stop_code == 0) {
      stop_code = code;
      spdlog::warn("{}: stopping every role", why);
      return;
    }
    // A second Ctrl-C while stopping: the user does not want to wait for shutdown timeouts.
    spdlog::warn("{} again: killing every role now", why);
    for (auto& c : kids)
      if (c.alive()) {
        signal_group(c, SIGKILL);
        c.kill_sent = true;
      }
  }

  // SIGTERM to each live child of the set, SIGKILL at its shutdown_timeout; returns when all
  // have been reaped.
  void stop(bool services) {
    stop_where([services](const Child& c) { return c.spec->service == services; }, SIGTERM);
  }

  // `first_signal` (SIGTERM, or SIGKILL at once) to each live child `which` selects, SIGKILL
  // at its shutdown_timeout; returns when all have been reaped.
  void stop_where(const std::function<bool(const Child&)>& which, int first_signal) {
    const auto now = Clock::now();
    for (auto& c : kids) {
      if (!c.alive() || !which(c) || c.term_sent || c.kill_sent) continue;
      signal_group(c, first_signal);
      c.term_sent = true;
      c.kill_sent = first_signal == SIGKILL;
      c.term_deadline = now + c.spec->shutdown_timeout;
    }
    while (true) {
      bool any = false;
      auto next_deadline = Clock::time_point::max();
      const auto at = Clock::now();
      for (auto& c : kids) {
        if (!c.alive() || !which(c)) continue;
        any = true;
        if (c.kill_sent) continue;
        if (at >= c.term_deadline) {
          spdlog::warn("{} did not stop within {:.1f} s of SIGTERM: sending SIGKILL", c.spec->name,
                       std::chrono::duration<double>(c.spec->shutdown_timeout).count());
          signal_group(c, SIGKILL);
          c.kill_sent = true;
        } else {
          next_deadline = std::min(next_deadline, c.term_deadline);
        }
      }
      if (!any) return;
      pump(next_deadline == Clock::time_point::max() ? kNoDeadline : next_deadline - at);
    }
  }

  void stop_all() {
    stop(false);
    stop(true);
    // Pipes held open by nobody now: read what is left.
    for (auto& c : kids) {
      drain(c, false);
      drain(c, true);
    }
  }

  SupervisorResult fail(Child& c, const std::string& what) {
    spdlog::error("{} {}: stopping every role", c.spec->name, what);
    stop_all();
    SupervisorResult r;
    r.exit_code = 100 + std::clamp(c.spec->code_index, 0, 99);
    r.failed = c.spec->name;
    r.message = fmt::format("role \"{}\" {}", c.spec->name, what);
    if (!c.tail.empty()) {
      r.message += "; its last stderr lines:";
      for (const auto& l : c.tail) r.message += "\n  " + l;
    } else {
      r.message += " (it wrote nothing to stderr)";
    }
    return r;
  }

  SupervisorResult stopped() {
    stop_all();
    SupervisorResult r;
    r.exit_code = stop_code;
    r.message = "stopped on request; every role has exited";
    return r;
  }

  using Selection = std::function<bool(const Child&)>;

  // Spawns the selected services, in parallel, and waits until each is ready; then spawns
  // the selected workers. A selected service that ends or is not ready in time fails the run.
  std::optional<SupervisorResult> start(const Selection& selected) {
    for (auto& c : kids)
      if (c.spec->service && selected(c)) spawn(c);
    while (true) {
      if (stop_code) return stopped();
      for (auto& c : kids)
        if (c.spec->service && selected(c) && c.exited)
          return fail(c,
                      (c.ready ? "" : "before it became ready: ") + describe_wait_status(c.status));
      const auto now = Clock::now();
      bool all_ready = true;
      for (auto& c : kids) {
        if (!c.spec->service || !selected(c) || c.ready) continue;
        if (c.spec->ready_endpoint.empty()) {
          c.ready = true;
          continue;
        }
        if (now >= c.next_probe) {
          if (try_connect(c.spec->ready_endpoint) &&
              (!c.spec->ready_probe || c.spec->ready_probe())) {
            mark_ready(c, c.spec->ready_probe ? "it answers requests" : "it accepts connections");
            continue;
          }
          c.next_probe = Clock::now() + opt.probe_interval;
        }
        if (now - c.started >= c.spec->startup_timeout)
          return fail(c,
                      fmt::format("never became ready: no \"listening on {}\" line and no "
                                  "connection accepted within its startup_timeout of {:.1f} s",
                                  c.spec->ready_endpoint,
                                  std::chrono::duration<double>(c.spec->startup_timeout).count()));
        all_ready = false;
      }
      if (all_ready) break;
      pump(opt.probe_interval);
    }
    for (auto& c : kids)
      if (!c.spec->service && selected(c)) spawn(c);
    return std::nullopt;
  }

  static std::string failure_text(const Child& c) {
    std::string what = describe_wait_status(c.status);
    if (c.spec->service)
      what += " while the deployment was running (a service must run until it is stopped)";
    return what;
  }

  // `c` failed: restarts its group when its policy allows (nullopt), else ends the run.
  std::optional<SupervisorResult> restart_or_fail(Child& c) {
    const RestartPolicy& policy = c.spec->restart;
    const std::string what = failure_text(c);
    if (!policy.on_failure) return fail(c, what);
    if (c.restarts >= policy.max_restarts)
      return fail(c, fmt::format("{}, after {} restart(s): its max_restarts is {}", what,
                                 c.restarts, policy.max_restarts));
    ++c.restarts;
    std::vector<bool> in_group(kids.size(), false);
    std::vector<std::string> names;
    for (size_t i = 0; i < kids.size(); ++i) {
      const auto& g = c.spec->restart_group;
      in_group[i] = &kids[i] == &c || std::find(g.begin(), g.end(), kids[i].spec->name) != g.end();
      if (in_group[i]) names.push_back(kids[i].spec->name);
    }
    const Selection selected = [&](const Child& k) {
      return in_group[static_cast<size_t>(&k - kids.data())];
    };
    const auto backoff = policy.delay(c.restarts);
    spdlog::error("{} {}: restart {} of {} (max_restarts) in {:.1f} s, with its group: {}",
                  c.spec->name, what, c.restarts, policy.max_restarts,
                  std::chrono::duration<double>(backoff).count(), fmt::join(names, ", "));
    const auto failed_at = Clock::now();
    stop_where([&](const Child& k) { return selected(k) && !k.spec->service; }, SIGKILL);
    stop_where([&](const Child& k) { return selected(k) && k.spec->service; }, SIGTERM);
    for (const auto deadline = failed_at + backoff; Clock::now() < deadline;) {
      if (stop_code) return stopped();
      pump(deadline - Clock::now());
    }
    for (auto& k : kids) {
      if (!selected(k)) continue;
      drain(k, false);
      drain(k, true);
      k.reset(k.spec->restart_argv ? k.spec->restart_argv() : k.spec->argv);
    }
    if (auto r = start(selected)) return r;
    spdlog::info("restarted {} ({:.2f} s after {} failed)", fmt::join(names, ", "),
                 std::chrono::duration<double>(Clock::now() - failed_at).count(), c.spec->name);
    return std::nullopt;
  }

  SupervisorResult run() {
    // An endpoint that already answers belongs to some other process: the role could not
    // bind it, and the connection probe would call it ready.
    for (auto& c : kids) {
      if (!c.spec->service) continue;
      if (!c.spec->ready_endpoint.empty() && try_connect(c.spec->ready_endpoint)) {
        c.tail.push_back(fmt::format("{} already accepts connections before {} started",
                                     c.spec->ready_endpoint, c.spec->name));
        return fail(c, fmt::format("cannot start: its endpoint {} is taken by another process",
                                   c.spec->ready_endpoint));
      }
    }
    if (auto r = start([](const Child&) { return true; })) return *r;
    // The run ends when every worker has.
    const bool any_worker =
        std::any_of(kids.begin(), kids.end(), [](const Child& c) { return !c.spec->service; });
    while (true) {
      // Workers first: a service's end usually makes its trainers fail too.
      Child* failed = nullptr;
      for (auto& c : kids)
        if (!failed && !c.spec->service && c.failed()) failed = &c;
      for (auto& c : kids)
        if (!failed && c.failed()) failed = &c;
      if (failed) {
        if (auto r = restart_or_fail(*failed)) return *r;
        continue;
      }
      if (stop_code) return stopped();
      const bool workers_done =
          any_worker && std::all_of(kids.begin(), kids.end(),
                                    [](const Child& c) { return c.spec->service || c.exited; });
      if (workers_done) {
        spdlog::info("every trainer exited 0: stopping the services");
        stop_all();
        // A service that then fails to stop in time was SIGKILLed; the run itself succeeded.
        return SupervisorResult{};
      }
      pump(kNoDeadline);
    }
  }

  // Last resort (an exception escaped run(), or run() was never called after a spawn):
  // nothing may outlive the supervisor.
  void kill_everything() {
    for (auto& c : kids)
      if (c.alive()) {
        signal_group(c, SIGKILL);
        c.status = c.process.wait();
        c.exited = true;
      }
  }
};

Supervisor::Supervisor(std::vector<ChildSpec> children, SupervisorOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->specs = std::move(children);
  impl_->opt = std::move(options);
  for (const auto& s : impl_->specs) {
    for (const auto& name : s.restart_group)
      if (std::none_of(impl_->specs.begin(), impl_->specs.end(),
                       [&](const ChildSpec& o) { return o.name == name; }))
        throw std::invalid_argument(fmt::format(
            "supervisor: {}'s restart_group names \"{}\", which is no child", s.name, name));
    Child c;
    c.spec = &s;
    c.argv = s.argv;
    impl_->kids.push_back(std::move(c));
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
    throw std::runtime_error("supervisor: pipe: " + errno_text(errno));
  impl_->stop_read = UniqueFd(p[0]);
  impl_->stop_write = UniqueFd(p[1]);
}

Supervisor::~Supervisor() {
  impl_->kill_everything();
}

SupervisorResult Supervisor::run() {
  if (impl_->ran) throw std::logic_error("Supervisor::run called twice");
  impl_->ran = true;
  // A handler rather than a signalfd: libraries (OpenBLAS) start threads before main, and a
  // process-directed signal may land on any of them, where a blocked-mask scheme cannot reach.
  SignalScope signals(impl_->opt.stop_signals, impl_->stop_write.get());
  try {
    return impl_->run();
  } catch (...) {
    impl_->kill_everything();
    throw;
  }
}

void Supervisor::request_stop() {
  const char b = 0;
  [[maybe_unused]] auto w = ::write(impl_->stop_write.get(), &b, 1);
}

}  // namespace dsactor::deploy
