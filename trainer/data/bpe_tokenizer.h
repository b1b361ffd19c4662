#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "trainer/data/merge_table.h"
#include "trainer/data/piece_cache.h"
#include "trainer/data/pretokenizer.h"
#include "trainer/data/tokenizer.h"

namespace dsactor::trainer {

// GPT-2's byte-level BPE: the text is cut into pieces by Gpt2PreTokenizer, and inside each
// piece the bytes start as their single-byte tokens and the adjacent pair of lowest merge
// rank is merged, leftmost first, until no pair has a rank (the reference encoder's rule:
// OpenAI's encoder.py, Hugging Face's tokenizers). The ids equal GPT-2's for any text.
//
// Speed: merges are found in a flat hash table keyed by the pair of ids; pieces already seen come
// from a cache (piece bytes -> ids), so English text mostly costs one regex match and one
// lookup per word. A piece is merged with a heap of candidate pairs (O(n log n)), so a
// megabyte without a space costs no more per byte than a sentence.
class BpeTokenizer final : public Tokenizer {
 public:
  // Checks the vocabulary: every single byte has an id, every merge's parts and result have
  // one, special ids are in range. Throws std::invalid_argument naming `name` and the entry.
  BpeTokenizer(Vocabulary vocab, std::string name, std::string source);
  ~BpeTokenizer() override;

  void encode_into(std::string_view text, std::vector<int32_t>& out,
                   bool allow_special = false) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::optional<int32_t> document_separator() const override { return separator_; }

  const Vocabulary& vocabulary() const { return vocab_; }

 private:
  struct Scratch;  // the merge heap and symbol list, reused across pieces

  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_piece(std::string_view piece, std::vector<int32_t>& out) const;

  Vocabulary vocab_;
  std::array<int32_t, 256> byte_id_{};
  MergeTable merges_;
  std::vector<int32_t> special_by_length_;  // special ids, longest text first
  std::optional<int32_t> separator_;

  // Encoding state, behind one lock per encode call.
  mutable std::mutex mutex_;
  mutable Gpt2PreTokenizer pretokenizer_;
  mutable PieceCache cache_;
  mutable std::unique_ptr<Scratch> scratch_;
};

}  // namespace dsactor::trainer
