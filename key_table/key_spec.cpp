#include "key_table/key_spec.h"

#include <cmath>

#include <fmt/format.h>

#include "key_table/byte_size.h"

namespace dsactor::key_table {
namespace {

std::string number_text(double d) {
  if (d == std::floor(d) && std::fabs(d) < 1e15) return fmt::format("{}", static_cast<int64_t>(d));
  return fmt::format("{}", d);
}

std::string quoted_list(const std::vector<std::string_view>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", \"" : "\"") + std::string(v[i]) + "\"";
  return out;
}

std::string type_text(const KeySpec& s, const Range& r) {
  switch (s.type) {
    case ValueType::kBool:
      return "true or false";
    case ValueType::kInt:
      return "an integer" + r.text();
    case ValueType::kFloat:
      return "a number" + r.text();
    case ValueType::kString:
      return "a string";
    case ValueType::kEnum: {
      std::vector<std::string_view> aliases;
      for (const auto& a : s.choice_aliases) aliases.push_back(a.first);
      return "one of " + quoted_list(s.choices) + (s.icase ? " (any case)" : "") +
             (aliases.empty() ? std::string() : "; also " + quoted_list(aliases));
    }
    case ValueType::kFloatPair:
      return "a list of two numbers" + r.text();
    case ValueType::kStringList:
      return "a list of strings";
    case ValueType::kBytes:
      return "a byte count (64GiB, 512MiB, 4GB or an integer)" + r.text();
    case ValueType::kSeconds:
      return "seconds, a number" + r.text();
    case ValueType::kEndpoint:
      return "tcp://HOST:PORT or ipc://PATH";
    case ValueType::kPath:
      return "a path";
    case ValueType::kStringMap:
      return "a map NAME: value";
    case ValueType::kObject:
      return "an object";
    case ValueType::kObjectList:
      return "a list of objects";
  }
  return "";
}

}  // namespace

bool Range::contains(double x) const {
  const bool below = min_exclusive ? !(x > min) : x < min;
  return !below && !(x > max);
}

std::string Range::text() const {
  const bool lo = min > -kUnbounded, hi = max < kUnbounded;
  if (lo && hi)
    return fmt::format(" in {}{}, {}]", min_exclusive ? "(" : "[", number_text(min),
                       number_text(max));
  if (lo) return fmt::format(" {} {}", min_exclusive ? ">" : ">=", number_text(min));
  if (hi) return fmt::format(" <= {}", number_text(max));
  return "";
}

std::string KeySpec::children_path() const {
  return type == ValueType::kObjectList ? std::string(path) + "[]" : std::string(path);
}

std::string allowed_text(const KeySpec& spec) {
  return allowed_text(spec, spec.range());
}

std::string allowed_text(const KeySpec& spec, const Range& range) {
  std::string t = spec.allowed_doc.empty() ? type_text(spec, range) : std::string(spec.allowed_doc);
  if (spec.nullable) t += " or null";
  return t;
}

std::string value_text(const Value& value, ValueType type) {
  return std::visit(
      [type](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          return "null";
        } else if constexpr (std::is_same_v<T, bool>) {
          return x ? "true" : "false";
        } else if constexpr (std::is_same_v<T, int64_t>) {
          return type == ValueType::kBytes && x >= 0 ? byte_size_text(static_cast<uint64_t>(x))
                                                     : fmt::format("{}", x);
        } else if constexpr (std::is_same_v<T, double>) {
          return fmt::format("{}", x);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return type == ValueType::kString || type == ValueType::kEnum ? "\"" + x + "\"" : x;
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          std::string out = "[";
          for (size_t i = 0; i < x.size(); ++i) out += (i ? ", " : "") + fmt::format("{}", x[i]);
          return out + "]";
        } else {
          return x.empty() ? std::string("[]") : std::string("[...]");
        }
      },
      value);
}

std::string default_text(const KeySpec& spec) {
  if (!spec.default_doc.empty()) return spec.default_doc;
  if (spec.has_children()) return "";
  if (std::holds_alternative<std::monostate>(spec.def)) return spec.nullable ? "null" : "none";
  return value_text(spec.def, spec.type);
}

}  // namespace dsactor::key_table
