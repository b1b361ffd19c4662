#include "key_table/key_suggestion.h"

#include <algorithm>
#include <cctype>
#include <limits>

namespace dsactor::key_table {
namespace {

size_t levenshtein(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t subst = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<std::string> nearest_key(std::string_view word,
                                       const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  size_t best_d = std::numeric_limits<size_t>::max();
  const std::string w = lower(word);
  for (const auto& c : candidates) {
    const size_t d = levenshtein(w, lower(c));
    if (d < best_d) best_d = d, best = c;
  }
  if (!best || best_d > std::max<size_t>(2, word.size() / 3)) return std::nullopt;
  return best;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const auto near = nearest_key(word, candidates);
  return near ? " (did you mean \"" + *near + "\"?)" : std::string();
}

}  // namespace dsactor::key_table
