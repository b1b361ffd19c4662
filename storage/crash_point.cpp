#include "storage/crash_point.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace dsactor::storage {

namespace {

struct CrashAt {
  std::string phase;
  long occurrence = 1;
};

CrashAt crash_at_from_env() {
  CrashAt c;
  const char* v = std::getenv("DSACTOR_TEST_CRASH_AT");
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

}  // namespace dsactor::storage
