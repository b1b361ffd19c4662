#include "cli/progress_bar.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace dsactor::cli {

ProgressBar::ProgressBar() : tty_(isatty(STDERR_FILENO) == 1) {}

static std::string clock_text(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{:02}:{:02}", s / 60, s % 60);
}

void ProgressBar::update(int64_t done, int64_t total, const std::string& fields,
                         double elapsed_seconds) {
  if (!tty_ || total <= 0) return;
  constexpr int kWidth = 30;
  const double frac = static_cast<double>(done) / static_cast<double>(total);
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  const double eta = done > 0 ? elapsed_seconds * (total - done) / done : 0.0;
  fmt::print(stderr, "\r\033[K[{}] {}/{} {} | {} elapsed, ETA {}", bar, done, total, fields,
             clock_text(elapsed_seconds), clock_text(eta));
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (tty_ && drawn_) fmt::print(stderr, "\n");
  drawn_ = false;
}

}  // namespace dsactor::cli
