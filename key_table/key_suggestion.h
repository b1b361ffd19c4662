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

}  // namespace dsactor::key_table
