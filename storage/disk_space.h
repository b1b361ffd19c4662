#pragma once
// What an operator needs beside a disk-full or I/O error: how much room the filesystem
// holding a path has left.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace dsactor::storage {

struct DiskSpace {
  uint64_t available = 0;  // bytes an unprivileged writer may still use (statvfs f_bavail)
  uint64_t total = 0;      // bytes of the filesystem
};

// The filesystem of `path` (or of its nearest existing parent); nullopt when statvfs fails.
std::optional<DiskSpace> disk_space(const std::filesystem::path& path);

// "12.0 MiB free of 1.0 GiB" for the filesystem of `path`, or "free space unknown (why)".
std::string free_space_text(const std::filesystem::path& path);

}  // namespace dsactor::storage
