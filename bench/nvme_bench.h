#pragma once

#include <cstddef>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "storage/nvme_file.h"

namespace dsactor::bench {

// Sequential write then read of one `total_bytes` file in `dir` through NvmeFile (block_size
// requests, queue_depth in flight, as the offload service does), and in the same run fio
// with the same block size and queue depth (io_uring, O_DIRECT) as the reference. Returns
// GB/s (1e9 bytes/s) of both, their ratios, the exact fio command lines, the I/O mode and
// whether fixed buffers were used. Without fio on PATH, or when fio fails, the "fio" part
// says so and no ratio is given. Files are deleted afterwards, also on error.
// total_bytes is rounded up to 4 KiB.
nlohmann::json run_nvme_bench(const std::filesystem::path& dir, size_t total_bytes,
                              const storage::NvmeOptions& options);

}  // namespace dsactor::bench
