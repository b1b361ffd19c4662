// The problems a ds_config walk collects instead of throwing at the first one: keys given
// as "auto" (Hugging Face's placeholder; its configs hold ten or more) and DeepSpeed
// features dsactor does not implement. Both are reported in one error, one line each, so
// a user fixes the whole file in one pass.
#include <array>
#include <string_view>

#include <fmt/format.h>

#include "trainer/config/ds_config_keys.h"
#include "trainer/config/ds_config_parse.h"

namespace dsactor::trainer::ds_config_detail {
namespace {

constexpr std::array<std::string_view, 3> kBatchKeys = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"};

bool given_concretely(const ParseState& state, std::string_view key) {
  return state.has(key) && state.autos.count(key) == 0;
}

// DeepSpeed's batch rule derives what is missing from train_batch_size or the micro batch
// (with the accumulation steps and the world size), so batch keys given as "auto" count as
// missing when one of those two is concrete: HF's Trainer fills train_batch_size the same
// way, as micro * accumulation * world size.
void derive_batch_autos(ParseState& state) {
  if (!given_concretely(state, kBatchKeys[0]) && !given_concretely(state, kBatchKeys[1])) return;
  for (const auto key : kBatchKeys) {
    const auto it = state.autos.find(key);
    if (it == state.autos.end()) continue;
    state.autos.erase(it);
    state.present.erase(state.present.find(key));
  }
}

std::string auto_lines(const ParseState& state) {
  std::string out;
  for (const auto* s : ds_key_table().rows())
    if (const auto it = state.autos.find(s->path); it != state.autos.end())
      out += fmt::format("\n  {}: \"auto\"; needs {}", it->first, it->second);
  return out;
}

}  // namespace

void report_collected(ParseState& state) {
  derive_batch_autos(state);
  if (state.unsupported.empty() && state.autos.empty()) return;
  std::string msg =
      fmt::format("{}: {} setting(s) dsactor cannot run as given, one per line:", state.source,
                  state.unsupported.size() + state.autos.size());
  for (const auto& line : state.unsupported) msg += "\n  " + line;
  msg += auto_lines(state);
  if (!state.unsupported.empty())
    msg += "\nRemove the unsupported settings (docs/ds_config.md has the compatibility table).";
  if (!state.autos.empty())
    msg += fmt::format(
        "\n\"auto\" is a placeholder the Hugging Face integration fills in; dsactor reads the "
        "file as it is and needs a concrete value for each of the {} key(s) above: write them "
        "into the file, or give them with --set KEY=VALUE (dsactor train, dsactor start --role "
        "trainer) or a deploy file's config_overrides. train_batch_size \"auto\" is derived "
        "(micro batch x gradient_accumulation_steps x world size) once "
        "train_micro_batch_size_per_gpu is concrete.",
        state.autos.size());
  throw ConfigError(msg);
}

}  // namespace dsactor::trainer::ds_config_detail
