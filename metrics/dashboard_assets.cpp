#include "metrics/dashboard_assets.h"

#include <iterator>

namespace dsactor::metrics {

namespace {

constexpr Asset kAssets[] = {
#include "dashboard_assets.inc"
};

}  // namespace

const Asset* find_dashboard_asset(std::string_view name) {
  for (const auto& a : kAssets)
    if (a.name == name) return &a;
  return nullptr;
}

}  // namespace dsactor::metrics
