#include "trainer/data/bpe_tokenizer.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace dsactor::trainer {
namespace {

// Pieces longer than this are merged every time instead of cached: they are rare, and one
// of them would take the room of thousands of words.
constexpr size_t kMaxCachedPiece = 256;
// The cache starts over when it holds this many ids (64 MiB, and their keys), so memory
// stays bounded on text with an endless supply of new words.
constexpr size_t kMaxCachedIds = size_t{16} << 20;

}  // namespace

// One symbol per byte of the piece, linked left to right; a merge keeps the left symbol and
// unlinks the right one. The heap holds (rank << 32 | position of the pair's left symbol),
// smallest first: the lowest rank, and among equal ranks the leftmost.
struct BpeTokenizer::Scratch {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1: none
    bool alive;
  };
  std::vector<Symbol> symbols;
  std::vector<uint64_t> heap;
};

BpeTokenizer::BpeTokenizer(Vocabulary vocab, std::string name, std::string source)
    : Tokenizer({std::move(name), vocabulary_fingerprint(vocab), std::move(source),
                 static_cast<int>(vocab.tokens.size())}),
      vocab_(std::move(vocab)),
      merges_(vocab_.merges.size()),
      cache_(kMaxCachedIds),
      scratch_(std::make_unique<Scratch>()) {
  const std::string& what = id().name;
  const int32_t n = static_cast<int32_t>(vocab_.tokens.size());
  std::vector<bool> is_special(vocab_.tokens.size(), false);
  for (int32_t s : vocab_.special) {
    if (s < 0 || s >= n)
      throw std::invalid_argument(
          fmt::format("tokenizer {}: special token id {} is outside [0, {})", what, s, n));
    is_special[s] = true;
  }
  std::unordered_map<std::string_view, int32_t> by_bytes;
  byte_id_.fill(-1);
  for (int32_t i = 0; i < n; ++i) {
    const std::string& t = vocab_.tokens[i];
    if (t.empty())
      throw std::invalid_argument(fmt::format("tokenizer {}: token id {} is empty", what, i));
    if (is_special[i]) continue;
    by_bytes.emplace(t, i);
    if (t.size() == 1 && byte_id_[static_cast<unsigned char>(t[0])] < 0)
      byte_id_[static_cast<unsigned char>(t[0])] = i;
  }
  for (int b = 0; b < 256; ++b)
    if (byte_id_[b] < 0)
      throw std::invalid_argument(fmt::format(
          "tokenizer {}: byte 0x{:02x} has no token of its own, so some text has no encoding", what,
          b));
  for (size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
    const auto [l, r] = vocab_.merges[rank];
    if (l < 0 || l >= n || r < 0 || r >= n)
      throw std::invalid_argument(fmt::format(
          "tokenizer {}: merge rank {} names id {} or {} outside [0, {})", what, rank, l, r, n));
    const auto merged = by_bytes.find(vocab_.tokens[l] + vocab_.tokens[r]);
    if (merged == by_bytes.end())
      throw std::invalid_argument(
          fmt::format("tokenizer {}: merge rank {} ({:?} + {:?}) makes a "
                      "token the vocabulary does not have",
                      what, rank, vocab_.tokens[l], vocab_.tokens[r]));
    // A pair listed twice keeps its last rank, as in GPT-2's encoder.py (a dict built from
    // the list).
    merges_.set(l, r, {static_cast<uint32_t>(rank), merged->second});
  }
  special_by_length_ = vocab_.special;
  std::stable_sort(special_by_length_.begin(), special_by_length_.end(), [&](int32_t a, int32_t b) {
    return vocab_.tokens[a].size() > vocab_.tokens[b].size();
  });
  for (int32_t s : vocab_.special)
    if (vocab_.tokens[s] == "<|endoftext|>") separator_ = s;
}

BpeTokenizer::~BpeTokenizer() = default;

void BpeTokenizer::encode_into(std::string_view text, std::vector<int32_t>& out,
                               bool allow_special) const {
  std::lock_guard lock(mutex_);
  if (!allow_special || special_by_length_.empty()) {
    encode_ordinary(text, out);
    return;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    size_t at = text.size();
    int32_t found = -1;
    for (int32_t s : special_by_length_) {  // longest first: it wins a tie
      const size_t p = text.find(vocab_.tokens[s], pos);
      if (p < at) at = p, found = s;
    }
    encode_ordinary(text.substr(pos, at - pos), out);
    if (found < 0) break;
    out.push_back(found);
    pos = at + vocab_.tokens[found].size();
  }
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  pretokenizer_.split(text, [&](std::string_view piece) { encode_piece(piece, out); });
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const uint64_t h = PieceCache::hash(piece);
  if (const auto hit = cache_.find(piece, h); !hit.empty()) {
    out.insert(out.end(), hit.begin(), hit.end());
    return;
  }
  const size_t first = out.size();
  merge_piece(piece, out);
  if (piece.size() <= kMaxCachedPiece) cache_.insert(piece, h, std::span(out).subspan(first));
}

void BpeTokenizer::merge_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() >= std::numeric_limits<int32_t>::max())
    throw std::invalid_argument(
        fmt::format("BPE: a piece of {} bytes without a break is too long", piece.size()));
  auto& symbols = scratch_->symbols;
  auto& heap = scratch_->heap;
  symbols.clear();
  heap.clear();
  const int32_t n = static_cast<int32_t>(piece.size());
  for (int32_t i = 0; i < n; ++i)
    symbols.push_back(
        {byte_id_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1, true});
  const auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const MergeTable::Merge* m = merges_.find(symbols[pos].id, symbols[next].id)) {
      heap.push_back(static_cast<uint64_t>(m->rank) << 32 | static_cast<uint32_t>(pos));
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const auto pos = static_cast<int32_t>(top & 0xFFFFFFFFu);
    auto& left = symbols[pos];
    // Stale entries: the left symbol was merged away, or either side has changed since.
    if (!left.alive || left.next < 0) continue;
    auto& right = symbols[left.next];
    const MergeTable::Merge* m = merges_.find(left.id, right.id);
    if (!m || m->rank != static_cast<uint32_t>(top >> 32)) continue;
    left.id = m->merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  const int32_t n = vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= n)
      throw std::invalid_argument(
          fmt::format("tokenizer {}: token {} at index {} is outside the vocabulary [0, {})",
                      id().name, ids[i], i, n));
    out += vocab_.tokens[ids[i]];
  }
  return out;
}

}  // namespace dsactor::trainer
