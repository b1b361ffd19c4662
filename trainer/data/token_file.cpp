#include "trainer/data/token_file.h"

#include <array>
#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <span>

#include <fmt/format.h>

#include "storage/checkpoint.h"

namespace dsactor::trainer {
namespace fs = std::filesystem;

// The format is little-endian on disk and we copy it with memcpy.
static_assert(std::endian::native == std::endian::little,
              "token files assume a little-endian host");

namespace {

constexpr size_t kHeaderBytes = kTokenFileHeaderInts * sizeof(int32_t);

[[noreturn]] void bad_token_file(const fs::path& path, const std::string& what) {
  throw DataError(fmt::format("token file {}: {}", path.string(), what));
}

}  // namespace

bool is_token_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  int32_t magic = 0;
  if (!in.read(reinterpret_cast<char*>(&magic), sizeof(magic))) return false;
  return magic == kTokenFileMagic;
}

std::vector<int32_t> read_token_file(const fs::path& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) bad_token_file(path, "cannot stat: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) bad_token_file(path, "cannot open for reading");
  if (size < kHeaderBytes)
    bad_token_file(path, fmt::format("{} bytes, shorter than the {}-byte header (truncated?)", size,
                                     kHeaderBytes));
  std::array<int32_t, kTokenFileHeaderInts> header{};
  if (!in.read(reinterpret_cast<char*>(header.data()), kHeaderBytes))
    bad_token_file(path, "read of the header failed");
  if (header[0] != kTokenFileMagic)
    bad_token_file(path, fmt::format("magic is {}, expected {} (an llm.c GPT-2 token file)",
                                     header[0], kTokenFileMagic));
  if (header[1] != kTokenFileVersion)
    bad_token_file(path,
                   fmt::format("version {} is unsupported; only version {} (uint16 tokens) is read",
                               header[1], kTokenFileVersion));
  const int64_t count = header[2];
  if (count <= 0)
    bad_token_file(path, fmt::format("header declares {} tokens; the file is empty", count));
  const uint64_t available_bytes = size - kHeaderBytes;
  const uint64_t want_bytes = static_cast<uint64_t>(count) * sizeof(uint16_t);
  if (want_bytes > available_bytes)
    bad_token_file(path,
                   fmt::format("header declares {} tokens but only {} are present (truncated file)",
                               count, available_bytes / sizeof(uint16_t)));
  if (want_bytes < available_bytes)
    bad_token_file(
        path, fmt::format("header declares {} tokens but {} bytes follow the header ({} extra)",
                          count, available_bytes, available_bytes - want_bytes));

  std::vector<uint16_t> raw(static_cast<size_t>(count));
  if (!in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(want_bytes)))
    bad_token_file(path, fmt::format("read of {} token bytes failed", want_bytes));
  return std::vector<int32_t>(raw.begin(), raw.end());
}

void write_token_file(const fs::path& path, const std::vector<int32_t>& tokens) {
  if (tokens.empty())
    bad_token_file(path, "refusing to write 0 tokens (llm.c cannot read an empty file)");
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    bad_token_file(path, fmt::format("{} tokens exceed the int32 count field", tokens.size()));
  std::vector<uint16_t> raw(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 0xFFFF)
      bad_token_file(path, fmt::format("token {} at index {} does not fit uint16", tokens[i], i));
    raw[i] = static_cast<uint16_t>(tokens[i]);
  }
  std::array<int32_t, kTokenFileHeaderInts> header{};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  const std::array<std::span<const std::byte>, 2> pieces{std::as_bytes(std::span(header)),
                                                         std::as_bytes(std::span(raw))};
  storage::write_file_atomic(path, pieces);
}

}  // namespace dsactor::trainer
