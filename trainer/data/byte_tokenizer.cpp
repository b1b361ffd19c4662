#include "trainer/data/byte_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "trainer/data/token_file.h"

namespace dsactor::trainer {
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("text data {}: cannot open for reading", path.string()));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

std::vector<int32_t> encode_bytes(std::string_view text) {
  std::vector<int32_t> out(text.size());
  std::transform(text.begin(), text.end(), out.begin(),
                 [](char c) { return static_cast<int32_t>(static_cast<unsigned char>(c)); });
  return out;
}

std::string decode_bytes(const std::vector<int32_t>& tokens) {
  std::string out(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= kByteVocabSize)
      throw std::invalid_argument(
          fmt::format("decode_bytes: token {} at index {} is outside the byte vocabulary [0, 255]",
                      tokens[i], i));
    out[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  }
  return out;
}

std::vector<int32_t> load_text_tokens(const fs::path& path) {
  const fs::file_status st = fs::status(path);
  if (!fs::exists(st)) throw DataError(fmt::format("text data {}: does not exist", path.string()));
  if (!fs::is_directory(st)) {
    const std::string text = read_file(path);
    if (text.find('\0') != std::string::npos)
      throw DataError(fmt::format(
          "text data {}: contains NUL bytes, so it is binary, not text (a token file must start "
          "with magic {})",
          path.string(), kTokenFileMagic));
    if (text.empty()) throw DataError(fmt::format("text data {}: file is empty", path.string()));
    return encode_bytes(text);
  }

  // Sorted paths make the token stream (and so every batch) independent of readdir order.
  std::vector<fs::path> files;
  size_t symlinks = 0, others = 0;
  for (auto it = fs::recursive_directory_iterator(path); it != fs::recursive_directory_iterator();
       ++it) {
    if (it->is_symlink()) {
      spdlog::debug("text data: skipping symlink {}", it->path().string());
      ++symlinks;
    } else if (it->is_regular_file()) {
      files.push_back(it->path());
    } else if (!it->is_directory()) {
      ++others;
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<int32_t> tokens;
  size_t binary = 0, used = 0;
  for (const fs::path& f : files) {
    const std::string text = read_file(f);
    if (text.find('\0') != std::string::npos) {
      spdlog::debug("text data: skipping binary file {} (contains a NUL byte)", f.string());
      ++binary;
      continue;
    }
    const std::vector<int32_t> t = encode_bytes(text);
    tokens.insert(tokens.end(), t.begin(), t.end());
    ++used;
  }
  if (tokens.empty())
    throw DataError(fmt::format(
        "text data {}: no text found ({} regular files: {} binary, {} empty; {} symlinks and {} "
        "special files skipped)",
        path.string(), files.size(), binary, used, symlinks, others));
  spdlog::debug("text data {}: {} bytes from {} files ({} binary, {} symlinks skipped)",
                path.string(), tokens.size(), used, binary, symlinks);
  return tokens;
}

std::vector<int32_t> load_tokens(const fs::path& path) {
  if (fs::is_regular_file(path) && is_token_file(path)) return read_token_file(path);
  return load_text_tokens(path);
}

}  // namespace dsactor::trainer
