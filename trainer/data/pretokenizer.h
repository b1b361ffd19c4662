#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

namespace dsactor::trainer {

// GPT-2's pre-tokenizer: the text is cut into pieces by
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (contractions, letters, numbers, other symbols, whitespace), and BPE runs inside each piece
// only. Matched with PCRE2 in UTF mode with Unicode properties (UCP), JIT-compiled where the
// library supports it. Bytes that are not valid UTF-8 match no branch of the pattern; each
// such run becomes a piece of its own, so every input byte lands in exactly one piece and
// decode(encode(x)) == x for any bytes.
//
// One object is not for concurrent use (it owns the match buffers); make one per thread.
class Gpt2PreTokenizer {
 public:
  Gpt2PreTokenizer();
  ~Gpt2PreTokenizer();
  Gpt2PreTokenizer(const Gpt2PreTokenizer&) = delete;
  Gpt2PreTokenizer& operator=(const Gpt2PreTokenizer&) = delete;

  // Calls on_piece(std::string_view) for each piece of `text`, in order; the pieces
  // concatenate to `text`.
  template <class OnPiece>
  void split(std::string_view text, OnPiece&& on_piece) {
    size_t pos = 0;
    while (pos < text.size()) {
      const auto [start, end] = next_match(text, pos);
      if (start > pos) on_piece(text.substr(pos, start - pos));  // invalid UTF-8 bytes
      if (end > start) on_piece(text.substr(start, end - start));
      pos = end;
    }
  }

  bool jit() const { return jit_; }

 private:
  struct Match {
    size_t start, end;
  };
  // The next match at or after `pos`, or {size, size} when there is none.
  Match next_match(std::string_view text, size_t pos);

  struct Pcre;
  std::unique_ptr<Pcre> pcre_;
  bool jit_ = false;
};

}  // namespace dsactor::trainer

namespace dsactor::trainer {

// The first position p >= from where `text` can be cut in two without changing any piece:
// text[p-1] is '\n' between two printable ASCII characters, so no branch of the pattern
// matches across p and the "\n" is a piece of its own either way. text.size() when there is
// none. Encoding text[0, p) and text[p, end) gives the ids of the whole text.
size_t piece_boundary(std::string_view text, size_t from);

}  // namespace dsactor::trainer
