#pragma once
// The words of config errors, the same in every file dsactor reads:
//   "<file>[:<line>]: <key.path>: <problem>"
// where the problem names the value and what is allowed ("value \"5\" is not allowed;
// expected an integer in [0, 3]"). The parser throws its own error type with the text.
#include <optional>
#include <string>
#include <string_view>

#include "key_table/key_spec.h"

namespace dsactor::key_table {

// Where a problem is: the file and, where the document format keeps it, the 1-based line.
struct Location {
  std::string_view file;
  int line = 0;  // 0: unknown (a JSON tree keeps no lines)

  // "file:line: path: problem"; without a line "file: path: problem"; without a path
  // "file:line: problem".
  std::string message(std::string_view path, std::string_view problem) const;
};

// "expected <allowed>, got <got>": a value of the wrong kind. `got` is the value as the
// parser shows it (`string "yes"`, `a list`).
std::string expected_problem(const KeySpec& spec, std::string_view got);

// "value <shown> is not allowed; expected <allowed>": the right kind, a wrong value.
std::string not_allowed_problem(const KeySpec& spec, std::string_view shown);
std::string not_allowed_problem(const KeySpec& spec, std::string_view shown, const Range& range);

// kEnum: the canonical spelling of `text` among spec.choices and spec.choice_aliases (any
// case where spec.icase).
std::optional<std::string_view> match_choice(const KeySpec& spec, std::string_view text);
// kEnum: why `text` is not a choice: a value dsactor knows but does not support, or one it
// does not know (with the nearest choice as a hint).
std::string choice_problem(const KeySpec& spec, std::string_view text);

}  // namespace dsactor::key_table
