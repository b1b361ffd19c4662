#include "storage/crash_point.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace dsactor::storage {

namespace {

// A phase and the number after its colon (the occurrence to crash at, or the pause in ms).
struct CrashAt {
  std::string phase;
  long occurrence = 1;
};

CrashAt crash_at_from_env(const char* name = "DSACTOR_TEST_CRASH_AT") {
  CrashAt c;
  const char* v = std::getenv(name);
  if (!v) return c;
  c.phase = v;
  if (const auto colon = c.phase.find(':'); colon != std::string::npos) {
    c.occurrence = std::strtol(c.phase.c_str() + colon + 1, nullptr, 10);
    c.phase.resize(colon);
  }
  return c;
}

}  // namespace

void crash_point(std::string_view phase) {
  static const CrashAt at = crash_at_from_env();
  static std::atomic<long> reached{0};
  if (at.phase.empty() || phase != at.phase) return;
  if (reached.fetch_add(1) + 1 != at.occurrence) return;
  ::raise(SIGKILL);
}

void pause_point(std::string_view phase) {
  static const CrashAt at = crash_at_from_env("DSACTOR_TEST_PAUSE_AT");
  if (at.phase.empty() || phase != at.phase) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(at.occurrence));
}

}  // namespace dsactor::storage
