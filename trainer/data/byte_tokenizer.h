#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/data/tokenizer.h"

namespace dsactor::trainer {

// Byte-level tokenizer: token id == byte value, vocab 256. Lossless for any input, so it
// needs no vocabulary file; it is what text data becomes when no --tokenizer is given.
inline constexpr int kByteVocabSize = 256;

std::vector<int32_t> encode_bytes(std::string_view text);
// Throws std::invalid_argument naming the index and value of a token outside [0, 255].
std::string decode_bytes(std::span<const int32_t> tokens);

// The byte tokenizer behind the Tokenizer interface (name "byte"; no special tokens, so
// allow_special changes nothing).
class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer();
  void encode_into(std::string_view text, std::vector<int32_t>& out,
                   bool allow_special = false) const override;
  std::string decode(std::span<const int32_t> ids) const override { return decode_bytes(ids); }
};

}  // namespace dsactor::trainer
