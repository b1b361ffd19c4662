#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/data/data_error.h"

namespace dsactor::trainer {

// Byte-level tokenizer: token id == byte value, vocab 256. Lossless for any input, so it
// needs no vocabulary file; GPT-2 BPE token files come in through read_token_file.
inline constexpr int kByteVocabSize = 256;

std::vector<int32_t> encode_bytes(std::string_view text);
// Throws std::invalid_argument naming the index and value of a token outside [0, 255].
std::string decode_bytes(const std::vector<int32_t>& tokens);

inline std::vector<int32_t> encode(std::string_view text) {
  return encode_bytes(text);
}
inline std::string decode(const std::vector<int32_t>& tokens) {
  return decode_bytes(tokens);
}

// Byte tokens of a text file, or of every regular text file under a directory
// (recursively, concatenated in sorted path order). Symlinks are skipped (so a link
// cannot pull in files twice or escape the tree), and so are files containing a NUL byte
// (binary data such as the fortune .dat indexes), each with a debug log line. A single
// file given directly that is binary is an error. Throws DataError when nothing is left.
std::vector<int32_t> load_text_tokens(const std::filesystem::path& path);

// A file that starts with the llm.c token-file magic is read with read_token_file;
// anything else (text file or directory) goes through load_text_tokens.
std::vector<int32_t> load_tokens(const std::filesystem::path& path);

}  // namespace dsactor::trainer
