#pragma once
// The dashboard's script and style sheet (metrics/assets/), compiled in by
// cmake/EmbedAssets.cmake.
#include <string_view>

namespace dsactor::metrics {

struct Asset {
  std::string_view name;  // the file's name under assets/
  std::string_view content_type;
  std::string_view body;
};

// Null for a name that is not an asset.
const Asset* find_dashboard_asset(std::string_view name);

}  // namespace dsactor::metrics
