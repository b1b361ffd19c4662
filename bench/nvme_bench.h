#pragma once

#include <cstddef>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "storage/nvme_file.h"

namespace dsactor::bench {

struct NvmeBenchOptions {
  // File size of each transfer (rounded up to 4 KiB).
  size_t total_bytes = size_t{1} << 30;
  // Each block size is measured on its own (issue 16 asks for >= 0.9x fio at both).
  std::vector<size_t> block_sizes = {size_t{128} << 10, size_t{1} << 20};
  // Pairs of ours and fio per block size (ours first in even pairs, fio first in odd ones);
  // ratios are taken within a pair.
  unsigned pairs = 3;
  // Queue depth, O_DIRECT and the rest; block_size is taken from block_sizes.
  storage::NvmeOptions aio;
};

// For each block size, `pairs` times, in alternating order: a sequential write then read of
// one file in `dir` through NvmeFile (block_size requests, queue_depth in flight, as the offload
// service does), then fio with the same block size and queue depth (io_uring, O_DIRECT). Our side
// moves the bytes through queue_depth buffers of one block each, the memory fio gives its
// iodepth requests, so both land their reads in the same amount of memory; a read into one
// 64 MiB window (read_64MiB_window_GBps) shows what a larger footprint costs. Returns GB/s
// (1e9 bytes/s) of each transfer, each pair's ratios, their median and range per block
// size, the exact fio command lines, the I/O mode and whether fixed buffers were used.
// Without fio on PATH, or when fio fails, the "fio" parts say so and no ratio is given.
// Files are deleted afterwards, also on error.
nlohmann::json run_nvme_bench(const std::filesystem::path& dir, const NvmeBenchOptions& options);

}  // namespace dsactor::bench
