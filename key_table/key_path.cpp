#include "key_table/key_path.h"

#include <vector>

namespace dsactor::key_table {
namespace {

std::vector<std::string_view> segments(std::string_view path) {
  std::vector<std::string_view> out;
  while (!path.empty()) {
    const auto dot = path.find('.');
    out.push_back(path.substr(0, dot));
    if (dot == std::string_view::npos) break;
    path.remove_prefix(dot + 1);
  }
  return out;
}

// "roles[1]" -> "roles".
std::string_view name_of(std::string_view segment) {
  return segment.substr(0, segment.find('['));
}

}  // namespace

std::string_view parent_of(std::string_view path) {
  const auto dot = path.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : path.substr(0, dot);
}

std::string_view leaf_of(std::string_view path) {
  const auto dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

std::string join_path(std::string_view parent, std::string_view key) {
  std::string out(parent);
  if (!out.empty()) out += '.';
  out += key;
  return out;
}

std::string template_path(std::string_view path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    out += path[i];
    if (path[i] != '[') continue;
    while (i + 1 < path.size() && path[i + 1] != ']') ++i;
  }
  return out;
}

std::string render_path(std::string_view row_path, std::string_view place) {
  const auto row = segments(row_path);
  const auto at = segments(place);
  std::string out;
  bool inside = true;  // every segment so far is one the place is inside
  for (size_t i = 0; i < row.size(); ++i) {
    inside = inside && i < at.size() && name_of(row[i]) == name_of(at[i]);
    out = join_path(out, inside && row[i].ends_with("[]") ? at[i] : row[i]);
  }
  return out;
}

}  // namespace dsactor::key_table
