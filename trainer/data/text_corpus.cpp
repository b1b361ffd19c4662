#include "trainer/data/text_corpus.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "trainer/data/pretokenizer.h"
#include "trainer/data/token_file.h"

namespace dsactor::trainer {
namespace fs = std::filesystem;

namespace {

// Progress is reported about this often within one file.
constexpr size_t kChunkBytes = size_t{4} << 20;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("text data {}: cannot open for reading", path.string()));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void list_directory(const fs::path& dir, std::vector<fs::path>& files) {
  std::vector<fs::path> found;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
       ++it) {
    if (it->is_symlink())
      spdlog::debug("text data: skipping symlink {}", it->path().string());
    else if (it->is_regular_file())
      found.push_back(it->path());
  }
  std::sort(found.begin(), found.end());
  files.insert(files.end(), found.begin(), found.end());
}

// The whole text, in chunks cut where no piece spans the cut.
void encode_in_chunks(std::string_view text, const Tokenizer& tokenizer, bool allow_special,
                      std::vector<int32_t>& out, CorpusProgress& progress,
                      const std::function<void(const CorpusProgress&)>& on_progress) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end =
        text.size() - pos <= kChunkBytes ? text.size() : piece_boundary(text, pos + kChunkBytes);
    tokenizer.encode_into(text.substr(pos, end - pos), out, allow_special);
    progress.bytes_done += end - pos;
    progress.text_bytes += end - pos;
    pos = end;
    if (on_progress) on_progress(progress);
  }
}

}  // namespace

std::vector<fs::path> text_files(const std::vector<fs::path>& inputs) {
  std::vector<fs::path> files;
  for (const fs::path& input : inputs) {
    const fs::file_status st = fs::status(input);
    if (!fs::exists(st))
      throw DataError(fmt::format("text data {}: does not exist", input.string()));
    if (fs::is_directory(st))
      list_directory(input, files);
    else
      files.push_back(input);
  }
  return files;
}

std::vector<int32_t> tokenize_text(const std::vector<fs::path>& inputs, const Tokenizer& tokenizer,
                                   bool allow_special,
                                   const std::function<void(const CorpusProgress&)>& on_progress) {
  const std::vector<fs::path> files = text_files(inputs);
  CorpusProgress progress;
  progress.files_total = files.size();
  for (const fs::path& f : files) progress.bytes_total += fs::file_size(f);
  const auto named = [&](const fs::path& f) {
    return std::find(inputs.begin(), inputs.end(), f) != inputs.end();
  };
  std::vector<int32_t> tokens;
  size_t binary = 0, used = 0;
  for (const fs::path& f : files) {
    const std::string text = read_file(f);
    ++progress.files_done;
    if (text.find('\0') != std::string::npos) {
      if (named(f))
        throw DataError(fmt::format(
            "text data {}: contains NUL bytes, so it is binary, not text (a token file must "
            "start with magic {})",
            f.string(), kTokenFileMagic));
      spdlog::debug("text data: skipping binary file {} (contains a NUL byte)", f.string());
      ++binary;
      progress.bytes_done += text.size();
      continue;
    }
    if (text.empty() && named(f))
      throw DataError(fmt::format("text data {}: file is empty", f.string()));
    if (text.empty()) continue;
    if (const auto separator = tokenizer.document_separator()) tokens.push_back(*separator);
    encode_in_chunks(text, tokenizer, allow_special, tokens, progress, on_progress);
    ++used;
  }
  const std::string what =
      inputs.size() == 1 ? inputs[0].string() : fmt::format("{} inputs", inputs.size());
  if (tokens.empty())
    throw DataError(fmt::format(
        "text data {}: no text found ({} regular files: {} binary, {} empty; symlinks inside "
        "directories are skipped)",
        what, files.size(), binary, files.size() - binary - used));
  spdlog::debug("text data {}: {} tokens ({} tokenizer) from {} files ({} binary skipped)", what,
                tokens.size(), tokenizer.id().name, used, binary);
  return tokens;
}

std::vector<int32_t> load_tokens(const fs::path& path, const Tokenizer& tokenizer) {
  if (fs::is_regular_file(path) && is_token_file(path)) return read_token_file(path);
  return tokenize_text({path}, tokenizer);
}

}  // namespace dsactor::trainer
