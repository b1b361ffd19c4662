#pragma once
// A service on a core of its own: the split `bench zero --service-own-core` runs a stage-3
// phase with. On these 2-core machines the trainer's compute threads and the offload
// service share both cores, so the service's CPU per step counts what sharing costs (its
// copies and Adam pass time-sliced against the trainer's GEMMs) as well as its own work;
// with a core to itself, as a service beside a GPU trainer has, it counts its own work.
#include <sched.h>

#include <string>
#include <vector>

namespace dsactor::bench {

struct CoreSplit {
  std::vector<int> trainer;  // every allowed CPU but the service's
  int service = -1;          // the highest allowed CPU
};

// The split of this process's allowed CPUs; throws std::runtime_error naming the count
// when there are fewer than two.
CoreSplit split_cores();

// While alive, the calling thread (and so what it spawns: a process started meanwhile
// inherits the mask, and its OpenMP runtime sizes its team from it) runs on `cpus` only;
// the thread's previous mask is restored at destruction.
class ThreadCpus {
 public:
  explicit ThreadCpus(const std::vector<int>& cpus);
  ~ThreadCpus();
  ThreadCpus(const ThreadCpus&) = delete;
  ThreadCpus& operator=(const ThreadCpus&) = delete;

 private:
  cpu_set_t previous_{};
};

// Every thread of this process on `cpus` from now on, and OpenMP's and OpenBLAS's thread
// counts set to their number (a forked phase's trainer). Throws std::runtime_error when the
// kernel refuses the mask.
void use_cpus(const std::vector<int>& cpus);

// The CPUs process `pid` (its main thread) may run on, from /proc/<pid>/status's
// Cpus_allowed_list ("0-1,3"), as the kernel has them; "" when unknown.
std::string cpus_allowed_list(pid_t pid);

}  // namespace dsactor::bench
