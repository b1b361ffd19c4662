#pragma once
// Byte counts as config files write them ("64GiB", "512MiB", "4GB", "4096").
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsactor::key_table {

// An integer, or a number with K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) or KB/MB/GB/TB
// (powers of 1000), case-insensitive, optionally separated by spaces; a fraction is fine
// when it comes out a whole number of bytes ("1.5KiB"). nullopt when `text` is none of these
// or the count does not fit in 64 bits.
std::optional<uint64_t> parse_byte_size(std::string_view text);

// The shortest exact spelling parse_byte_size reads back: "64GiB", "1MiB", "1000", "0".
std::string byte_size_text(uint64_t bytes);

// What parse_byte_size accepts, in words, for "value X is not a byte count; ..." messages.
inline constexpr std::string_view kByteSizeSyntax =
    "write an integer or a number with a suffix K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) "
    "or KB, MB, GB, TB (powers of 1000), e.g. 64GiB";

}  // namespace dsactor::key_table
