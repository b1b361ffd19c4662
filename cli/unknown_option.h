#pragma once
// What CLI11 says of an argument no option takes ("The following arguments were not
// expected: 3 --stepz", in reverse order) names neither the command nor the option meant.
// This names both: the subcommand being parsed, the first unknown option, and the nearest
// option of that subcommand.
#include <CLI/CLI.hpp>
#include <string>

namespace dsactor::cli {

// For an ExtrasError raised while parsing `app`: "dsactor start: unknown option --stepz (did
// you mean --steps?); `dsactor start --help` lists the options". A stray positional value
// is named as one.
std::string describe_unexpected_arguments(const CLI::App& app);

}  // namespace dsactor::cli
