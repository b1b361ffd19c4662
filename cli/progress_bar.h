#pragma once
#include <cstdint>
#include <string>

namespace dsactor::cli {

// One-line progress bar redrawn in place on a TTY (step, loss, tokens/s, ETA). When stderr
// is not a terminal it stays silent: plain log lines carry the progress there instead.
class ProgressBar {
 public:
  ProgressBar();
  bool active() const { return tty_; }
  void update(int64_t done, int64_t total, const std::string& fields, double elapsed_seconds);
  void finish();

 private:
  bool tty_;
  bool drawn_ = false;
};

}  // namespace dsactor::cli
