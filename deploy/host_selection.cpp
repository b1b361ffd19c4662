#include "deploy/host_selection.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

namespace dsactor::deploy {

namespace {

using SlotSpec = std::map<std::string, std::set<int>>;  // host -> slots; empty set: all

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

// "worker-0@worker-1:0,2" against the hostfile; `flag` names the option in errors.
SlotSpec parse_spec(const std::string& text, const char* flag,
                    const std::vector<HostSlots>& hosts) {
  SlotSpec spec;
  for (const std::string& node : split(text, '@')) {
    const size_t colon = node.find(':');
    const std::string host = node.substr(0, colon);
    const auto it = std::find_if(hosts.begin(), hosts.end(),
                                 [&](const HostSlots& h) { return h.host == host; });
    if (host.empty())
      throw LaunchConfigError(fmt::format(
          "dsactor launch: {} \"{}\": expected HOST[:SLOT,...][@HOST[:SLOT,...]...]", flag, text));
    if (it == hosts.end())
      throw LaunchConfigError(fmt::format(
          "dsactor launch: {} names host '{}', which the hostfile does not list", flag, host));
    std::set<int>& slots = spec[host];
    if (colon == std::string::npos) continue;
    for (const std::string& s : split(node.substr(colon + 1), ',')) {
      int slot = -1;
      const auto r = std::from_chars(s.data(), s.data() + s.size(), slot);
      if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || slot < 0)
        throw LaunchConfigError(
            fmt::format("dsactor launch: {} \"{}\": slot '{}' of host '{}' is not a slot number",
                        flag, text, s, host));
      if (slot >= it->slots)
        throw LaunchConfigError(
            fmt::format("dsactor launch: {} names slot {} of host '{}', which has slots 0..{}",
                        flag, slot, host, it->slots - 1));
      slots.insert(slot);
    }
  }
  return spec;
}

}  // namespace

std::vector<SelectedHost> select_hosts(const std::vector<HostSlots>& hosts, const HostFilter& f) {
  if (!f.include.empty() && !f.exclude.empty())
    throw LaunchConfigError(
        "dsactor launch: --include and --exclude are mutually exclusive (as in DeepSpeed)");
  const SlotSpec include =
      f.include.empty() ? SlotSpec{} : parse_spec(f.include, "--include", hosts);
  const SlotSpec exclude =
      f.exclude.empty() ? SlotSpec{} : parse_spec(f.exclude, "--exclude", hosts);
  std::vector<SelectedHost> out;
  for (const HostSlots& h : hosts) {
    SelectedHost s{h.host, {}};
    const auto in = include.find(h.host);
    const auto ex = exclude.find(h.host);
    if (!f.include.empty() && in == include.end()) continue;
    for (int slot = 0; slot < h.slots; ++slot) {
      if (in != include.end() && !in->second.empty() && !in->second.count(slot)) continue;
      if (ex != exclude.end() && (ex->second.empty() || ex->second.count(slot))) continue;
      s.slots.push_back(slot);
    }
    if (!s.slots.empty()) out.push_back(std::move(s));
  }
  if (f.num_nodes == 0 || f.num_nodes < -1)
    throw LaunchConfigError(fmt::format(
        "dsactor launch: --num_nodes {} is not allowed; expected 1 or more", f.num_nodes));
  if (f.num_gpus == 0 || f.num_gpus < -1)
    throw LaunchConfigError(fmt::format(
        "dsactor launch: --num_gpus {} is not allowed; expected 1 or more", f.num_gpus));
  if (f.num_nodes > 0 && static_cast<size_t>(f.num_nodes) < out.size()) out.resize(f.num_nodes);
  if (f.num_gpus > 0)
    for (SelectedHost& s : out) {
      if (static_cast<size_t>(f.num_gpus) > s.slots.size())
        throw LaunchConfigError(fmt::format(
            "dsactor launch: --num_gpus {} is more than the {} slot(s) selected on host '{}'",
            f.num_gpus, s.slots.size(), s.host));
      s.slots.resize(f.num_gpus);
    }
  if (out.empty())
    throw LaunchConfigError("dsactor launch: --include/--exclude leave no slot to run on");
  for (SelectedHost& s : out)
    for (size_t i = 0; i < s.slots.size(); ++i)
      if (s.slots[i] != static_cast<int>(i)) s.leading_slots = false;
  return out;
}

}  // namespace dsactor::deploy
