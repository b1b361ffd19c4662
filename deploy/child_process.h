#pragma once
// One child process: started (an exec'd program, or a forked call of our own code), signalled,
// waited for and reaped here, for every part of dsactor that runs children (the Supervisor of
// `dsactor up` / `launch`, ServiceProcess, the benchmarks' forked phases, the tests).
//
// Starting: for exec, an argv[0] without '/' is looked up in PATH and the environment is built
// before fork, so the child only calls async-signal-safe functions before execve. An execve
// (or chdir) that fails is reported back through a close-on-exec pipe: exec() returns only
// once the child runs the program, and throws ChildStartError ("cannot start <exe>: <why>")
// otherwise. Every descriptor of ours that lacks O_CLOEXEC (sockets, files other code opened)
// is closed in the exec'd program; a forked call keeps them.
//
// Exit: pidfd() becomes readable when the child exits, so a caller can poll it beside its
// other descriptors. The destructor SIGKILLs (the whole group, with own_process_group) and
// reaps a child that was never reaped: no child outlives its ChildProcess unnoticed.
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dsactor::deploy {

// An owned file descriptor, closed by the destructor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  ~UniqueFd() { reset(); }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// Where one of the child's output streams (stdout, stderr) goes.
struct Output {
  enum class Kind {
    kInherit,  // ours
    kNull,     // /dev/null
    kPipe,     // a pipe; its read end is ChildProcess::take_stdout() / take_stderr()
    kFile,     // `file`, created or truncated (opened before fork: a bad path throws there)
    kStdout,   // stderr only: wherever stdout goes
  };
  Kind kind = Kind::kInherit;
  std::filesystem::path file;

  static Output inherit() { return {}; }
  static Output null() { return {Kind::kNull, {}}; }
  static Output pipe() { return {Kind::kPipe, {}}; }
  static Output to_file(std::filesystem::path f) { return {Kind::kFile, std::move(f)}; }
  static Output same_as_stdout() { return {Kind::kStdout, {}}; }
};

struct ChildOptions {
  // Added to the inherited environment; a name already there takes the value given here.
  std::vector<std::pair<std::string, std::string>> env;
  std::filesystem::path workdir;  // the child's working directory; empty: ours
  bool stdin_null = false;        // /dev/null as stdin instead of ours
  // When set: stdin is a pipe holding this text (at most 4096 bytes), then end of file. How
  // a secret reaches a child (or a remote shell) without showing in any argv.
  std::optional<std::string> stdin_text;
  Output out, err;
  // The child leads a new process group: signal() and the destructor reach its own children
  // too, the terminal's Ctrl-C does not reach it, and whatever is left in the group when the
  // child is reaped (a shell's background job) is SIGKILLed then.
  bool own_process_group = false;
  // PR_SET_PDEATHSIG(SIGKILL): the child dies with us even when we are SIGKILLed. Linux sends
  // it when the *thread* that started the child ends, so start such children from a thread
  // that outlives them.
  bool die_with_parent = false;
  // Unblocks every signal and gives SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE and SIGCHLD
  // their default action in the child, whatever we blocked or ignored.
  bool default_signals = false;
};

// The child could not be started; what() says why ("cannot start ...", "fork: ...").
class ChildStartError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ChildProcess {
 public:
  // Runs argv (argv[0]: a path, or a name looked up in PATH). Returns once the program runs.
  static ChildProcess exec(const std::vector<std::string>& argv, const ChildOptions& options = {});
  // Forks and calls body(report_fd) in the child, which then _exit()s with body's return value
  // (1 when it throws, with what() on stderr): no destructor or atexit handler of our state
  // runs there. report_fd is the write end of a pipe whose read end is take_report() here,
  // a way back for a result. The caller must not have started threads (only the forking one
  // exists in the child) unless body touches nothing they may have held locked.
  static ChildProcess fork_call(const std::function<int(int report_fd)>& body,
                                const ChildOptions& options = {});

  ChildProcess() = default;  // no child
  ChildProcess(ChildProcess&& o) noexcept;
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ~ChildProcess();  // SIGKILL and reap when not reaped yet
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }  // also the process group id with own_process_group
  // Readable once the child has exited (poll it with POLLIN); -1 once it was reaped.
  int pidfd() const { return pidfd_.get(); }
  bool started() const { return pid_ > 0; }
  bool reaped() const { return status_.has_value(); }
  // The wait status (waitpid's) once reaped.
  const std::optional<int>& status() const { return status_; }

  // Read ends of the Output::pipe() streams and of fork_call's report pipe; empty when there
  // is none or it was taken already.
  UniqueFd take_stdout() { return std::move(out_); }
  UniqueFd take_stderr() { return std::move(err_); }
  UniqueFd take_report() { return std::move(report_); }

  // Sends sig to the child, or to its whole group with own_process_group; nothing once the
  // child was reaped (its pid may belong to another process by then).
  void signal(int sig) const;
  // Reaps the child if it has exited; its wait status then, else nullopt.
  std::optional<int> try_wait();
  // Waits (on pidfd) until the child exits or `timeout` passes; the wait status, or nullopt.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  int wait();  // blocks until the child exits; its wait status

 private:
  static ChildProcess start(const ChildOptions& options, const std::string& what,
                            const std::function<void(int start_pipe)>& in_child);
  void on_reaped(int status);
  void kill_and_reap() noexcept;

  pid_t pid_ = -1;
  bool own_group_ = false;
  UniqueFd pidfd_, out_, err_, report_;
  std::optional<int> status_;
};

// A wait status as a shell reports it: the exit code, or 128 + the signal that killed it.
int exit_code(int wait_status);
// "exited with code 3", "was killed by signal 9 (SIGKILL)".
std::string describe_wait_status(int wait_status);
// "SIGTERM", or "signal 64" for one without a name.
std::string signal_name(int sig);

// `sh`-safe rendering of an argv, for dry runs, messages and remote shells.
std::string shell_quote(const std::vector<std::string>& argv);

// An argv[0] as exec() finds it: a name with '/' as is, else the first executable of that
// name in PATH; nullopt when there is none.
std::optional<std::string> find_executable(const std::string& name);

// What a command printed (stdout and stderr together, in order) and its wait status.
struct CommandOutput {
  int status = 0;
  std::string output;
};
// Runs argv to its end (stdin /dev/null) and collects its output; throws ChildStartError when
// it cannot start.
CommandOutput run_and_capture(const std::vector<std::string>& argv);

// Waits until the process `pid` (any process, not only a child of ours) has exited (zombies
// count as exited), or `timeout` passes: through a pidfd, no polling. True when it has.
bool wait_for_exit(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace dsactor::deploy
