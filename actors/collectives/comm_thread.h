#pragma once

// The one thread a communicator's operations run on, in submission order: every rank must
// issue a communicator's collectives in the same order (NCCL's and our Gloo algorithms
// alike), and a CUDA device is selected per thread. The first operation that throws
// leaves the communicator in an unknown state (messages of the failed operation may still
// arrive): `on_failure` tears it down on this thread, and every later operation fails at
// once, naming that first failure.

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

namespace dsactor::actors {

class CommThread {
 public:
  struct Hooks {
    std::function<void()> on_start;    // first, on the thread (select a device)
    std::function<void()> on_failure;  // after the first failed operation
    std::function<void()> on_exit;     // last, on the thread (release what on_start made)
  };
  explicit CommThread(Hooks hooks);
  // stop().
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Runs fn on the thread after everything submitted before it. The future fails with
  // CollectiveError: fn's exception, or the earlier failure that made this one pointless.
  // Throws CollectiveError when the thread is stopping.
  std::future<void> submit(const char* op, std::function<void()> fn);
  // What is queued still runs; then the thread ends and is joined. Idempotent.
  void stop();

 private:
  void run();

  Hooks hooks_;
  std::string failure_;  // set on the thread by the first failed operation
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dsactor::actors
