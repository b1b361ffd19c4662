#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "storage/nvme_file.h"

namespace dsactor::bench {

struct ScaleBenchOptions {
  std::string model = "gpt2";
  int block_size = 64;  // the model's context, cut to keep the compute short
  int micro_batch = 1;
  int steps = 2;
  uint64_t seed = 1234;
  // Where the service's NVMe tier goes; empty: a temporary directory under $TMPDIR (or
  // /tmp), removed afterwards.
  std::filesystem::path nvme_dir;
  uint64_t memory_limit = uint64_t{2} << 30;     // the service's --memory-limit
  storage::NvmeOptions aio;                      // the service's --aio-block-size / queue depth
  int timeout_seconds = 600;                     // per service request
  uint64_t reference_bytes = uint64_t{1} << 30;  // the file fio and our io_uring move
  // Payloads through the same-host shared-memory arena (ZeroOptions::shared_memory): its
  // pages, once touched, count in both processes' RSS. false: frames over loopback tcp.
  bool shared_memory = true;
};

// ZeRO-Infinity on one box: `model` trained `steps` steps as ZeRO-3 with offload_param and
// offload_optimizer through a real `dsactor start --role offload --nvme DIR` child whose
// --memory-limit is far below the model's state, so every partition lives on the NVMe
// tier. The trainer runs in a forked child (its own VmHWM). Reports the peak RSS of the
// trainer and of the service, partitions.dat's bytes on disk against the state (master,
// m, v), the time per step split into fetch, compute, push and commit, and the service's
// NVMe read/write rates (its /proc/<pid>/io over the steps) against fio's at the same
// block size and queue depth on the same directory, in the same run.
nlohmann::json run_scale_bench(const ScaleBenchOptions& options);

}  // namespace dsactor::bench
