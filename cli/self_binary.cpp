#include "cli/self_binary.h"

#include <filesystem>
#include <stdexcept>

namespace dsactor::cli {

std::string self_binary(const char* command) {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec)
    throw std::runtime_error(std::string(command) +
                             ": cannot find its own binary (/proc/self/exe): " + ec.message());
  return p.string();
}

}  // namespace dsactor::cli
