#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsactor::key_table {

// The candidate closest to `word` by case-insensitive edit distance, if it is close enough
// to be a plausible typo (distance <= max(2, |word| / 3)). Drives the "did you mean" hint of
// every config file dsactor reads (ds_config, deployment files).
std::optional<std::string> nearest_key(std::string_view word,
                                       const std::vector<std::string>& candidates);

// " (did you mean \"<nearest>\"?)", or "" when no candidate is close enough.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// ASCII lower case: key names and the values compared case-insensitively are ASCII.
std::string lower(std::string_view s);

}  // namespace dsactor::key_table
