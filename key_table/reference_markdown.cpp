#include "key_table/reference_markdown.h"

#include <algorithm>

#include <fmt/format.h>

#include "key_table/key_path.h"

namespace dsactor::key_table {
namespace {

// A table cell: a '|' in the text would end the cell.
std::string cell(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

bool has_rows(const KeyTable& table, const KeySpec& s) {
  return s.has_children() && !table.children(s.children_path()).empty();
}

std::string description(const KeyTable& table, const KeySpec& s, std::string_view parent) {
  std::string doc(s.doc);
  if (has_rows(table, s)) doc += fmt::format(" See `{}` below.", s.path);
  std::vector<std::string> aliases;
  for (const auto* a : table.aliases_of(s))
    aliases.push_back(fmt::format("`{}`{}",
                                  parent_of(a->path) == parent ? leaf_of(a->path) : a->path,
                                  a->deprecated ? " (deprecated)" : ""));
  if (!aliases.empty()) doc += fmt::format(" Also spelled {}.", fmt::join(aliases, ", "));
  if (s.deprecated) doc += " Accepted with a warning.";
  if (s.support != Support::kSupported ||
      !std::holds_alternative<std::monostate>(s.supported_value))
    doc += fmt::format(" dsactor: {}.", support_text(s));
  return doc;
}

std::string section(const KeyTable& table, const KeySpec* parent_row) {
  const std::string parent = parent_row ? parent_row->children_path() : std::string();
  std::string md;
  if (!parent_row)
    md += "\n## Top level\n\n";
  else if (!parent_row->section.empty())
    md += fmt::format("\n## {}\n\n{}\n\n", parent_row->section, parent_row->doc);
  else
    md += fmt::format("\n## `{}`\n\n{}{}\n\n", parent_row->path, parent_row->doc,
                      parent_row->nullable ? " May be null." : "");
  std::vector<const KeySpec*> rows;
  for (const auto* s : table.children(parent))
    if (s->alias_of.empty()) rows.push_back(s);
  const bool by_role =
      std::any_of(rows.begin(), rows.end(), [](const KeySpec* s) { return s->applies_to != 0; });
  md += by_role ? fmt::format(
                      "| key | {} | default | allowed | description |\n"
                      "|---|---|---|---|---|\n",
                      table.applicability(parent).plural)
                : std::string("| key | default | allowed | description |\n|---|---|---|---|\n");
  for (const auto* s : rows) {
    md += fmt::format("| `{}` |", leaf_of(s->path));
    if (by_role) md += fmt::format(" {} |", table.applicability_text(s->applies_to, parent));
    md += fmt::format(" {} | {} | {} |\n", cell(default_text(*s)), cell(allowed_text(*s)),
                      cell(description(table, *s, parent)));
  }
  return md;
}

}  // namespace

std::string support_text(const KeySpec& s) {
  std::string mark;
  switch (s.support) {
    case Support::kSupported:
      mark = "supported";
      if (!std::holds_alternative<std::monostate>(s.supported_value))
        mark += fmt::format(" only as `{}`; other values are unsupported",
                            value_text(s.supported_value, s.type));
      break;
    case Support::kDiffers:
      mark = "supported, differs";
      break;
    case Support::kNoEffect:
      mark = "accepted, no effect";
      break;
    case Support::kUnsupported:
      mark = "unsupported";
      break;
  }
  if (!s.support_note.empty()) mark += fmt::format(": {}", s.support_note);
  return mark;
}

std::string compatibility_markdown(const KeyTable& table, std::string_view preamble) {
  std::string md(preamble);
  md += "| key | in dsactor |\n|---|---|\n";
  for (const auto* s : table.rows()) {
    if (!s->alias_of.empty()) continue;
    std::string key = fmt::format("`{}`", s->path);
    for (const auto* a : table.aliases_of(*s)) key += fmt::format(" (`{}`)", leaf_of(a->path));
    md += fmt::format("| {} | {} |\n", cell(key), cell(support_text(*s)));
  }
  return md;
}

std::string reference_markdown(const KeyTable& table, std::string_view preamble) {
  std::string md(preamble);
  md += section(table, nullptr);
  for (const auto* s : table.rows())
    if (s->alias_of.empty() && has_rows(table, *s)) md += section(table, s);
  return md;
}

}  // namespace dsactor::key_table
