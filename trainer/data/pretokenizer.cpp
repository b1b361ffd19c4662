#include "trainer/data/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace dsactor::trainer {
namespace {

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string pcre_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

struct Gpt2PreTokenizer::Pcre {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ~Pcre() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match);
    pcre2_code_free(code);
  }
};

Gpt2PreTokenizer::Gpt2PreTokenizer() : pcre_(std::make_unique<Pcre>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // MATCH_INVALID_UTF: text with bytes that are not UTF-8 is matched around them instead of
  // being refused as a whole.
  pcre_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern.data()), kGpt2Pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!pcre_->code)
    throw std::runtime_error(fmt::format("PCRE2 refused GPT-2's pre-tokenizer pattern at {}: {}",
                                         offset, pcre_message(error)));
  jit_ = pcre2_jit_compile(pcre_->code, PCRE2_JIT_COMPLETE) == 0;
  pcre_->match = pcre2_match_data_create_from_pattern(pcre_->code, nullptr);
  pcre_->context = pcre2_match_context_create(nullptr);
  if (!pcre_->match || !pcre_->context) throw std::bad_alloc();
  if (jit_) {
    // `\s+(?!\S)` backtracks through a whitespace run: a long run needs more than the
    // default 32 KiB of JIT stack.
    pcre_->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (!pcre_->jit_stack) throw std::bad_alloc();
    pcre2_jit_stack_assign(pcre_->context, nullptr, pcre_->jit_stack);
  }
}

Gpt2PreTokenizer::~Gpt2PreTokenizer() = default;

Gpt2PreTokenizer::Match Gpt2PreTokenizer::next_match(std::string_view text, size_t pos) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = jit_ ? pcre2_jit_match(pcre_->code, subject, text.size(), pos, 0, pcre_->match,
                                  pcre_->context)
                : PCRE2_ERROR_JIT_BADOPTION;
  // Beyond the JIT stack (a whitespace run of megabytes) the interpreter takes over: it keeps
  // its backtracking on the heap.
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION)
    rc = pcre2_match(pcre_->code, subject, text.size(), pos, PCRE2_NO_JIT, pcre_->match,
                     pcre_->context);
  if (rc == PCRE2_ERROR_NOMATCH) return {text.size(), text.size()};
  if (rc < 0)
    throw std::runtime_error(
        fmt::format("GPT-2 pre-tokenizer: PCRE2 failed at byte {}: {}", pos, pcre_message(rc)));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(pcre_->match);
  return {ovector[0], ovector[1]};
}

}  // namespace dsactor::trainer

namespace dsactor::trainer {

size_t piece_boundary(std::string_view text, size_t from) {
  const auto printable = [&](size_t i) { return text[i] > ' ' && text[i] < 0x7F; };
  for (size_t p = std::max<size_t>(from, 2); p < text.size(); ++p)
    if (text[p - 1] == '\n' && printable(p - 2) && printable(p)) return p;
  return text.size();
}

}  // namespace dsactor::trainer
