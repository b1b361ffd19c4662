#include "actors/collectives/comm_thread.h"

#include <spdlog/spdlog.h>

#include "actors/collectives/collectives.h"

namespace dsactor::actors {

CommThread::CommThread(Hooks hooks) : hooks_(std::move(hooks)) {
  thread_ = std::thread([this] { run(); });
}

CommThread::~CommThread() {
  stop();
}

void CommThread::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CommThread::run() {
  if (hooks_.on_start) hooks_.on_start();
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stop requested and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
  if (hooks_.on_exit) hooks_.on_exit();
}

std::future<void> CommThread::submit(const char* op, std::function<void()> fn) {
  auto promise = std::make_shared<std::promise<void>>();
  auto future = promise->get_future();
  auto task = [this, op, promise, fn = std::move(fn)] {
    if (!failure_.empty()) {
      promise->set_exception(std::make_exception_ptr(CollectiveError(
          std::string(op) + ": communicator unusable after an earlier failure: " + failure_)));
      return;
    }
    try {
      fn();
      promise->set_value();
    } catch (const std::exception& e) {
      failure_ = e.what();
      spdlog::error("collectives: {}", failure_);
      if (hooks_.on_failure) hooks_.on_failure();
      promise->set_exception(std::make_exception_ptr(CollectiveError(failure_)));
    }
  };
  {
    std::lock_guard lock(mutex_);
    if (stop_) throw CollectiveError(std::string(op) + ": collectives are shutting down");
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return future;
}

}  // namespace dsactor::actors
