#include "offload_service/service_phases.h"

namespace dsactor::offload {

const char* phase_name(ServicePhase phase) {
  switch (phase) {
    case ServicePhase::kReceive:
      return "receive";
    case ServicePhase::kChecksum:
      return "checksum";
    case ServicePhase::kAccumulate:
      return "accumulate";
    case ServicePhase::kAdam:
      return "adam";
    case ServicePhase::kServe:
      return "serve";
    case ServicePhase::kCommit:
      return "commit";
    case ServicePhase::kMetadata:
      return "metadata";
    case ServicePhase::kCount:
      break;
  }
  return "unknown";
}

PhaseFigures ServicePhases::figures(ServicePhase phase) const {
  const Entry& e = entries_[static_cast<size_t>(phase)];
  return {static_cast<double>(e.nanoseconds.load(std::memory_order_relaxed)) * 1e-9,
          static_cast<double>(e.cpu_nanoseconds.load(std::memory_order_relaxed)) * 1e-9,
          e.bytes.load(std::memory_order_relaxed), e.operations.load(std::memory_order_relaxed)};
}

}  // namespace dsactor::offload
