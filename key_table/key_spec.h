#pragma once
// One row of a config file's key table: a key's path, type, default, allowed values,
// where it applies and its one-line doc. The row is the only place a key is described;
// the parser validates against it, messages and the reference page quote it.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace dsactor::key_table {

enum class ValueType {
  kBool,
  kInt,
  kFloat,
  kString,
  kEnum,       // one of `choices`
  kFloatPair,  // a list of two numbers
  kStringList,
  kBytes,       // a byte count, "64GiB" or an integer (byte_size.h)
  kSeconds,     // a duration in seconds
  kEndpoint,    // tcp://HOST:PORT or ipc://PATH
  kPath,        // a file or directory
  kStringMap,   // NAME: value pairs with names of the user's choosing
  kObject,      // keys of its own: the rows whose path is "<path>.<key>"
  kObjectList,  // a list of objects: the rows whose path is "<path>[].<key>"
};

// A default or parsed value, converted to the key's type: int64_t for kInt and kBytes,
// double for kFloat and kSeconds, std::string for kString, kEnum, kPath and kEndpoint.
// std::monostate is "null" or "not given".
using Value = std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<double>,
                           std::vector<std::string>>;

inline Value bool_value(bool b) {
  return Value(b);
}
inline Value int_value(int64_t i) {
  return Value(i);
}
inline Value float_value(double d) {
  return Value(d);
}
inline Value string_value(std::string s) {
  return Value(std::move(s));
}

inline constexpr double kUnbounded = std::numeric_limits<double>::infinity();

// Bounds of a number; min_exclusive turns ">=" into ">".
struct Range {
  double min = -kUnbounded;
  double max = kUnbounded;
  bool min_exclusive = false;

  bool contains(double x) const;
  // " in [0, 3]", " in (0, 86400]", " >= 1", " > 0", " <= 5", or "" when unbounded.
  std::string text() const;
};

// How far dsactor follows DeepSpeed on a key: the compatibility table of the reference
// page, and what the parser says when a key of a feature dsactor lacks is given.
enum class Support {
  kSupported,    // does what DeepSpeed does
  kDiffers,      // works, with the difference support_note says
  kNoEffect,     // accepted and checked; dsactor does not act on it (support_note: why)
  kUnsupported,  // a DeepSpeed feature dsactor does not implement: given, it is refused
};

struct KeySpec {
  std::string_view path;  // key_path.h spelling: "optimizer.params.lr", "roles[].listen"
  ValueType type;
  Value def = {};  // monostate: no default the table can state (required, derived, or see
                   // default_doc)
  double min = -kUnbounded;
  double max = kUnbounded;
  bool min_exclusive = false;
  std::vector<std::string_view> choices = {};  // kEnum: canonical spellings
  bool icase = false;                          // kEnum: any case is accepted
  // kEnum: values the file format knows but dsactor does not implement (a clearer error).
  std::vector<std::string_view> unsupported = {};
  // kEnum: other spellings of a choice, {alias, canonical} ("float16" for "fp16").
  std::vector<std::pair<std::string_view, std::string_view>> choice_aliases = {};
  std::string_view doc = {};
  std::string_view alias_of = {};  // another row's path: this spelling sets that key
  bool deprecated = false;         // accepted with a warning
  bool nullable = false;           // null is allowed
  // Bit i set: the key applies where KeyTable::applicability().names[i] does; 0: everywhere.
  unsigned applies_to = 0;
  std::string default_doc = {};       // the default in words, where `def` cannot say it
  std::string_view allowed_doc = {};  // what is allowed, where type and range cannot say it
  std::string_view section = {};      // kObject/kObjectList: its heading on the reference
                                      // page (default: the path in backticks)
  Support support = Support::kSupported;
  std::string_view support_note = {};  // kDiffers: the difference; otherwise optional words
  // Set: the only value dsactor supports; any other is a DeepSpeed feature dsactor does not
  // implement (optimizer.params.amsgrad: false).
  Value supported_value = {};

  Range range() const { return {min, max, min_exclusive}; }
  bool has_children() const { return type == ValueType::kObject || type == ValueType::kObjectList; }
  // The parent path of this row's children: "optimizer", "roles[]".
  std::string children_path() const;
};

// What a key accepts, in words ("an integer in [0, 3]", "true or false or null"): the
// "allowed" of error messages and of the reference page. `range` replaces the row's own
// where the parser knows a tighter one (a rank below the world size).
std::string allowed_text(const KeySpec& spec);
std::string allowed_text(const KeySpec& spec, const Range& range);

// The default as the reference page shows it.
std::string default_text(const KeySpec& spec);

// A value as the reference page shows it: true, 10, 0.001, "log", [0.9, 0.999], 64GiB.
std::string value_text(const Value& value, ValueType type);

}  // namespace dsactor::key_table
