#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "trainer/data/data_error.h"

namespace dsactor::trainer {

// llm.c's GPT-2 token file (dev/data/data_common.py write_datafile, llmc/dataloader.h):
// a header of 256 little-endian int32 - [0] magic 20240520, [1] version 1, [2] token
// count, the rest zero - followed by exactly that many uint16 tokens.
inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int kTokenFileHeaderInts = 256;

// Throws DataError naming the file and the numbers for: a file shorter than the header,
// wrong magic, unsupported version, count <= 0, count larger than the data present
// (truncated) or smaller (trailing bytes; llm.c rejects that too).
std::vector<int32_t> read_token_file(const std::filesystem::path& path);

// Writes atomically (temp + fsync + rename). Throws DataError for an empty vector or a
// token outside [0, 65535], which the uint16 format cannot hold.
void write_token_file(const std::filesystem::path& path, const std::vector<int32_t>& tokens);

// True when the file exists and its first int32 is kTokenFileMagic.
bool is_token_file(const std::filesystem::path& path);

}  // namespace dsactor::trainer
