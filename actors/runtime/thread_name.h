#pragma once
// The name of the calling thread as top, perf, gdb and /proc/<pid>/task/*/comm show it.
// Every detached actor names its own thread after what it is (gateway, coordinator,
// worker-0, fetcher, ...) instead of CAF's "caf.actor" for all, so a thread's CPU, its
// wake-ups (`bench zero`'s by-thread figures) and a profile's samples say whose they are.
// Threads the named one starts (an OpenMP team's helpers) inherit the name.

#include <string_view>

namespace dsactor::actors {

// At most 15 bytes are kept (the kernel's limit); longer names are cut there. A failure
// (not expected on Linux) leaves the old name: names only label, nothing depends on them.
void name_this_thread(std::string_view name);

}  // namespace dsactor::actors
