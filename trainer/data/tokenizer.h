#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsactor::trainer {

// What a byte-level tokenizer is made of: every id's bytes, the BPE merges in rank order and
// the special tokens. Two tokenizers with equal vocabularies give equal ids for every text.
struct Vocabulary {
  std::vector<std::string> tokens;                  // id -> the bytes it stands for
  std::vector<std::pair<int32_t, int32_t>> merges;  // rank -> (left id, right id)
  std::vector<int32_t> special;                     // ids matched as literal text, never by BPE
};

// "sha256:" + the hex SHA-256 (libsodium) of the vocabulary in a canonical form: the token
// count, each token's length and bytes in id order, each merge's ids in rank order, each
// special id (all as little-endian uint32). The file format a vocabulary came from (one
// tokenizer.json or vocab.json + merges.txt) does not change it.
std::string vocabulary_fingerprint(const Vocabulary& vocab);

// Which tokenizer a model was trained with, as checkpoints and safetensors files record it.
struct TokenizerId {
  std::string name;         // "byte", or the name of the directory or file it came from
  std::string fingerprint;  // vocabulary_fingerprint(); what decides whether two are the same
  std::string source;       // absolute path it was loaded from; "" for the byte tokenizer
  int vocab_size = 0;
};

// Text <-> token ids. Encoding is thread-safe (a BPE tokenizer's word cache is locked per
// call); decode never changes state.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Appends the ids of `text` to `out`. With allow_special, the literal text of a special
  // token (GPT-2's "<|endoftext|>") becomes its id; otherwise it is encoded as ordinary text
  // (what GPT-2's reference encoder does).
  virtual void encode_into(std::string_view text, std::vector<int32_t>& out,
                           bool allow_special = false) const = 0;
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const {
    std::vector<int32_t> out;
    encode_into(text, out, allow_special);
    return out;
  }
  // The bytes of `ids` (special tokens as their text). Throws std::invalid_argument naming
  // the index and id of one outside [0, vocab_size).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  // The id that starts every document of a corpus (llm.c's convention for GPT-2:
  // "<|endoftext|>"), if the vocabulary has one.
  virtual std::optional<int32_t> document_separator() const { return std::nullopt; }

  const TokenizerId& id() const { return id_; }
  int vocab_size() const { return id_.vocab_size; }

 protected:
  explicit Tokenizer(TokenizerId id) : id_(std::move(id)) {}

 private:
  TokenizerId id_;
};

// "byte" is the byte tokenizer (id == byte, vocab 256). Anything else is a path to a GPT-2
// style byte-level BPE (see bpe_files.h: a directory, tokenizer.json, or vocab.json /
// encoder.json with its merges file beside it). Errors name the path and what is wrong.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

}  // namespace dsactor::trainer
