#pragma once
// Where the offload service's time goes: wall seconds, the counting thread's CPU seconds,
// bytes and operations per phase of its work, counted by the actors that do it (the
// coordinator, the partition workers) and read by the metrics (`dsactor_offload_phase_*`)
// and `bench zero`. Cheap enough to stay on: two reads of each clock and four relaxed atomic
// adds per operation, and an operation is a whole partition (a push, a fetch, an Adam
// pass), never an element. CPU time is the counting thread's own (on a loaded machine wall
// time stretches with the neighbours, CPU time much less), and for Adam also that of the
// OpenMP helpers its kernel runs on.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>

#include "kernels/cpu/team_cpu.h"

namespace dsactor::offload {

enum class ServicePhase : size_t {
  kReceive,     // the coordinator routing a push to its worker (payload bytes: frame or arena)
  kChecksum,    // crc32c of pushed arena bytes and of served bytes (once per version)
  kAccumulate,  // a push into the fp32 gradient (widened), with its sum of squares
  kAdam,        // the commit's Adam pass over a partition (bytes: its fp32 parameters)
  kServe,       // a fetch's bytes into the arena or a frame, besides their checksum
  kCommit,      // the coordinator's whole CommitStep, the workers' Adam and metadata included
  kMetadata,    // synced metadata batches (NVMe tier; nothing on the RAM tier)
  kCount
};
inline constexpr size_t kServicePhaseCount = static_cast<size_t>(ServicePhase::kCount);

// The metrics' label of a phase: "receive", "checksum", ...
const char* phase_name(ServicePhase phase);

struct PhaseFigures {
  double seconds = 0;
  double cpu_seconds = 0;  // of the threads that counted (Adam: with its OpenMP helpers)
  uint64_t bytes = 0;
  uint64_t operations = 0;
};

class ServicePhases {
 public:
  void add(ServicePhase phase, std::chrono::steady_clock::duration took, uint64_t cpu_nanoseconds,
           uint64_t bytes) {
    Entry& e = entries_[static_cast<size_t>(phase)];
    e.nanoseconds.fetch_add(
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()),
        std::memory_order_relaxed);
    e.cpu_nanoseconds.fetch_add(cpu_nanoseconds, std::memory_order_relaxed);
    e.bytes.fetch_add(bytes, std::memory_order_relaxed);
    e.operations.fetch_add(1, std::memory_order_relaxed);
  }
  PhaseFigures figures(ServicePhase phase) const;

 private:
  struct Entry {
    std::atomic<uint64_t> nanoseconds{0}, cpu_nanoseconds{0}, bytes{0}, operations{0};
  };
  std::array<Entry, kServicePhaseCount> entries_;
};

// Adds the time from its construction to its destruction (or to stop()) to a phase; does
// nothing with no counters.
class PhaseTimer {
 public:
  PhaseTimer(ServicePhases* phases, ServicePhase phase, uint64_t bytes)
      : phases_(phases),
        phase_(phase),
        bytes_(bytes),
        start_(std::chrono::steady_clock::now()),
        cpu_start_(phases ? cpu_nanoseconds() : 0) {}
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  ~PhaseTimer() { stop(); }
  void stop() {
    if (!phases_) return;
    phases_->add(phase_, std::chrono::steady_clock::now() - start_, cpu_nanoseconds() - cpu_start_,
                 bytes_);
    phases_ = nullptr;
  }

 private:
  ServicePhases* phases_;
  ServicePhase phase_;
  uint64_t bytes_;
  std::chrono::steady_clock::time_point start_;
  uint64_t cpu_start_;

  // The Adam kernel runs on OpenMP threads besides the counting one: their CPU is the
  // pass's too (it was about 60 ms a step on gpt2, outside every phase, while counted).
  uint64_t cpu_nanoseconds() const {
    if (phase_ == ServicePhase::kAdam) return kernels::cpu::team_cpu_nanoseconds();
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
  }
};

}  // namespace dsactor::offload
