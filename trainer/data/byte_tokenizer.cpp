#include "trainer/data/byte_tokenizer.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace dsactor::trainer {
namespace {

TokenizerId byte_tokenizer_id() {
  Vocabulary v;
  for (int b = 0; b < kByteVocabSize; ++b) v.tokens.emplace_back(1, static_cast<char>(b));
  return {"byte", vocabulary_fingerprint(v), "", kByteVocabSize};
}

}  // namespace

std::vector<int32_t> encode_bytes(std::string_view text) {
  std::vector<int32_t> out(text.size());
  std::transform(text.begin(), text.end(), out.begin(),
                 [](char c) { return static_cast<int32_t>(static_cast<unsigned char>(c)); });
  return out;
}

std::string decode_bytes(std::span<const int32_t> tokens) {
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

ByteTokenizer::ByteTokenizer() : Tokenizer(byte_tokenizer_id()) {}

void ByteTokenizer::encode_into(std::string_view text, std::vector<int32_t>& out, bool) const {
  out.reserve(out.size() + text.size());
  for (char c : text) out.push_back(static_cast<unsigned char>(c));
}

}  // namespace dsactor::trainer
