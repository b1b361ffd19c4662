#include "storage/disk_space.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace dsactor::storage {

namespace {

std::string bytes_text(uint64_t b) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, kUnits[u]);
}

// A file that cannot be created yet still lives on its directory's filesystem.
std::filesystem::path existing(std::filesystem::path p) {
  std::error_code ec;
  while (!p.empty() && !std::filesystem::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  return p.empty() ? std::filesystem::path(".") : p;
}

}  // namespace

std::optional<DiskSpace> disk_space(const std::filesystem::path& path) {
  struct statvfs s {};
  if (::statvfs(existing(path).c_str(), &s) != 0) return std::nullopt;
  return DiskSpace{static_cast<uint64_t>(s.f_bavail) * s.f_frsize,
                   static_cast<uint64_t>(s.f_blocks) * s.f_frsize};
}

std::string free_space_text(const std::filesystem::path& path) {
  const auto space = disk_space(path);
  if (!space) return fmt::format("free space unknown ({})", std::strerror(errno));
  return fmt::format("{} free of {}", bytes_text(space->available), bytes_text(space->total));
}

}  // namespace dsactor::storage
