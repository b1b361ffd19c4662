#include "trainer/data/tokenizer.h"

#include <sodium.h>

#include <stdexcept>

#include <fmt/format.h>

#include "trainer/data/bpe_files.h"
#include "trainer/data/byte_tokenizer.h"

namespace dsactor::trainer {

std::string vocabulary_fingerprint(const Vocabulary& vocab) {
  crypto_hash_sha256_state state;
  crypto_hash_sha256_init(&state);
  const auto put = [&](uint32_t v) {
    const unsigned char le[4] = {static_cast<unsigned char>(v), static_cast<unsigned char>(v >> 8),
                                 static_cast<unsigned char>(v >> 16),
                                 static_cast<unsigned char>(v >> 24)};
    crypto_hash_sha256_update(&state, le, sizeof(le));
  };
  put(static_cast<uint32_t>(vocab.tokens.size()));
  for (const std::string& t : vocab.tokens) {
    put(static_cast<uint32_t>(t.size()));
    crypto_hash_sha256_update(&state, reinterpret_cast<const unsigned char*>(t.data()), t.size());
  }
  put(static_cast<uint32_t>(vocab.merges.size()));
  for (const auto& [l, r] : vocab.merges)
    put(static_cast<uint32_t>(l)), put(static_cast<uint32_t>(r));
  put(static_cast<uint32_t>(vocab.special.size()));
  for (int32_t s : vocab.special) put(static_cast<uint32_t>(s));
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256_final(&state, digest);
  std::string hex = "sha256:";
  for (unsigned char b : digest) hex += fmt::format("{:02x}", b);
  return hex;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  if (spec.empty()) throw std::invalid_argument("--tokenizer is empty: give \"byte\" or a path");
  return load_bpe_tokenizer(spec);
}

}  // namespace dsactor::trainer
