#pragma once
// CPU time and page faults of this process and of another (a service child), from
// getrusage and /proc/<pid>/stat: what the benches report per step beside wall time, which
// is far noisier on a shared machine.
#include <sys/types.h>

#include <map>
#include <string>
#include <utility>

namespace dsactor::bench {

// This process's user and system CPU seconds.
std::pair<double, double> own_cpu_seconds();
// The sum of fields [first, last] (1-based, as proc(5) numbers them) of another process's
// /proc/<pid>/stat; 0 when unknown.
double process_stat_sum(pid_t pid, int first, int last);
// utime + stime of another process, in seconds; 0 when unknown.
double process_cpu_seconds(pid_t pid);
// CPU seconds of a process's live threads, summed by thread name (/proc/<pid>/task/*/comm):
// which of its threads the CPU went to. From each thread's schedstat (nanoseconds), or its
// stat's utime + stime (clock ticks) where the kernel has no schedstat. Empty when unknown.
std::map<std::string, double> thread_cpu_seconds(pid_t pid);
// How many times each of a process's live threads was put on a CPU (schedstat's third
// field: wake-ups and returns from preemption), summed by thread name. A thread that wakes
// for every message costs its wake-ups besides its work, which on a paravirtualized guest
// can be most of it. Empty where the kernel has no schedstat.
std::map<std::string, double> thread_runs(pid_t pid);
// Minor page faults (field 10): the arena's pages the service touches after the trainer
// gave them back each cost one.
double process_minor_faults(pid_t pid);
double own_minor_faults();
// Bytes of a process's shared memory (memfd, tmpfs) mapped with 2 MiB page-table entries
// (/proc/<pid>/smaps_rollup: ShmemPmdMapped, or FilePmdMapped where the kernel counts it
// there); 0 when unknown.
double shared_pmd_mapped_bytes(pid_t pid);
// The 1-minute load average (/proc/loadavg); -1 when unknown.
double load_average();

}  // namespace dsactor::bench
