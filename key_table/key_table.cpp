#include "key_table/key_table.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "key_table/key_path.h"
#include "key_table/key_suggestion.h"

namespace dsactor::key_table {

KeyTable::KeyTable(std::vector<const KeySpec*> rows, std::vector<Applicability> applicabilities)
    : rows_(std::move(rows)), applicabilities_(std::move(applicabilities)) {}

KeyTable::KeyTable(std::vector<const KeySpec*> rows, Applicability applicability)
    : KeyTable(std::move(rows), std::vector<Applicability>{std::move(applicability)}) {}

KeyTable KeyTable::of(const std::vector<KeySpec>& rows, Applicability applicability) {
  std::vector<const KeySpec*> specs;
  for (const auto& r : rows) specs.push_back(&r);
  return KeyTable(std::move(specs), std::move(applicability));
}

size_t KeyTable::index_of(const KeySpec& spec) const {
  const auto it = std::find(rows_.begin(), rows_.end(), &spec);
  if (it == rows_.end()) throw std::logic_error("KeyTable::index_of: not a row of this table");
  return static_cast<size_t>(it - rows_.begin());
}

const KeySpec* KeyTable::find(std::string_view path) const {
  const std::string t = template_path(path);
  for (const auto* s : rows_)
    if (s->path == t) return s;
  return nullptr;
}

std::vector<const KeySpec*> KeyTable::children(std::string_view parent) const {
  const std::string t = template_path(parent);
  std::vector<const KeySpec*> out;
  for (const auto* s : rows_)
    if (parent_of(s->path) == t) out.push_back(s);
  return out;
}

const KeySpec* KeyTable::child(std::string_view parent, std::string_view key) const {
  for (const auto* s : children(parent))
    if (leaf_of(s->path) == key) return s;
  return nullptr;
}

std::vector<const KeySpec*> KeyTable::aliases_of(const KeySpec& spec) const {
  std::vector<const KeySpec*> out;
  for (const auto* s : rows_)
    if (s->alias_of == spec.path) out.push_back(s);
  return out;
}

const Applicability& KeyTable::applicability(std::string_view parent) const {
  static const Applicability kNone;
  const std::string t = template_path(parent);
  const Applicability* best = nullptr;
  for (const auto& a : applicabilities_) {
    const bool inside = a.scope.empty() || t == a.scope || t.rfind(a.scope + ".", 0) == 0;
    if (inside && (!best || a.scope.size() > best->scope.size())) best = &a;
  }
  return best ? *best : kNone;
}

bool KeyTable::applies(const KeySpec& spec, size_t which) const {
  return spec.applies_to == 0 || (spec.applies_to >> which) & 1u;
}

std::string KeyTable::applicability_text(unsigned mask, std::string_view parent) const {
  if (mask == 0) return "all";
  const auto& names_of = applicability(parent).names;
  std::vector<std::string> names;
  for (size_t i = 0; i < names_of.size(); ++i)
    if ((mask >> i) & 1u) names.push_back(names_of[i]);
  return fmt::format("{}", fmt::join(names, ", "));
}

std::string KeyTable::unknown_key_problem(std::string_view parent, std::string_view key) const {
  std::vector<std::string> siblings;
  for (const auto* c : children(parent)) siblings.emplace_back(leaf_of(c->path));
  std::string hint;
  if (const auto near = nearest_key(key, siblings)) {
    hint = join_path(parent, *near);
  } else {
    for (const auto* s : rows_)
      if (leaf_of(s->path) == key) {
        hint = render_path(s->path, parent);
        break;
      }
  }
  return fmt::format(
      "unknown key{}; keys allowed {}: {}",
      hint.empty() ? std::string() : fmt::format(" (did you mean \"{}\"?)", hint),
      parent.empty() ? std::string("at the top level") : fmt::format("in {}", parent),
      fmt::join(siblings, ", "));
}

std::string KeyTable::not_applicable_problem(const KeySpec& spec, size_t which) const {
  const std::string_view parent = parent_of(spec.path);
  const Applicability& a = applicability(parent);
  const std::string& here = a.names.at(which);
  std::vector<std::string_view> takes;
  for (const auto* c : children(parent))
    if (c->alias_of.empty() && applies(*c, which)) takes.push_back(leaf_of(c->path));
  return fmt::format("key \"{}\" applies to {} {}, not to {} {}; {} takes: {}", leaf_of(spec.path),
                     a.noun, applicability_text(spec.applies_to, parent), a.noun, here, here,
                     fmt::join(takes, ", "));
}

}  // namespace dsactor::key_table
