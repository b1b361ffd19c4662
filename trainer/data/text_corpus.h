#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "trainer/data/data_error.h"
#include "trainer/data/tokenizer.h"

namespace dsactor::trainer {

// The text files under `inputs`: each file itself, or every regular file under a directory
// (recursively, in sorted path order, so the token stream never depends on readdir order).
// Symlinks inside a directory are skipped (a link cannot pull in files twice or escape the
// tree), with a debug log line. Throws DataError for a path that does not exist.
std::vector<std::filesystem::path> text_files(const std::vector<std::filesystem::path>& inputs);

struct CorpusProgress {
  uint64_t bytes_done = 0, bytes_total = 0;  // of every file listed, binary ones included
  uint64_t text_bytes = 0;                   // of the text encoded so far
  size_t files_done = 0, files_total = 0;
};

// The tokens of the text files under `inputs` (text_files), in order. Files holding a NUL
// byte are binary (the fortune .dat indexes, say) and skipped with a debug log line; a file
// named directly that is binary or empty is an error. When the tokenizer has a document
// separator (GPT-2's "<|endoftext|>"), every file starts with it, as in llm.c's data
// scripts; the byte tokenizer concatenates the files as they are. Large files are encoded in
// chunks cut at piece_boundary() (the same ids as one call), and on_progress is called after
// each chunk. allow_special: see Tokenizer::encode_into. Throws DataError naming the input
// when no text is found.
std::vector<int32_t> tokenize_text(
    const std::vector<std::filesystem::path>& inputs, const Tokenizer& tokenizer,
    bool allow_special = false, const std::function<void(const CorpusProgress&)>& on_progress = {});

// A file that starts with the llm.c token-file magic is read with read_token_file; anything
// else (text file or directory) goes through tokenize_text with `tokenizer`.
std::vector<int32_t> load_tokens(const std::filesystem::path& path, const Tokenizer& tokenizer);

}  // namespace dsactor::trainer
