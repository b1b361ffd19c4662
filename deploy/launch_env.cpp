#include "deploy/launch_env.h"

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace dsactor::deploy {

namespace {

// Whole-string decimal integer (optional leading '-'), surrounding blanks allowed.
std::optional<long long> to_int(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  if (b == std::string::npos) return std::nullopt;
  s = s.substr(b, e - b + 1);
  long long v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

int int_var(const EnvLookup& env, const std::string& name, long long min, long long max) {
  const auto raw = env(name);
  if (!raw) throw LaunchConfigError(name + " is not set");
  const auto v = to_int(*raw);
  if (!v) throw LaunchConfigError(name + "='" + *raw + "' is not an integer");
  if (*v < min || *v > max) {
    throw LaunchConfigError(name + "=" + *raw + " is out of range [" + std::to_string(min) + ", " +
                            std::to_string(max) + "]");
  }
  return static_cast<int>(*v);
}

struct Style {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  bool local_rank_required;
};

constexpr Style kStyles[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", false},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", true},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", true},
};

constexpr long long kMaxWorld = 1 << 20;

}  // namespace

std::optional<std::string> process_env(const std::string& name) {
  // getenv is only read here; dsactor never calls setenv after startup.
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

std::optional<LaunchInfo> launch_info_from_env(const EnvLookup& env) {
  const Style* style = nullptr;
  for (const auto& s : kStyles) {
    if (env(s.rank) || env(s.size)) {
      style = &s;
      break;
    }
  }
  if (!style) return std::nullopt;

  LaunchInfo info;
  info.source = style->name;
  const std::string rank_var = style->rank;
  const std::string size_var = style->size;
  if (!env(rank_var)) {
    throw LaunchConfigError(size_var + " is set but " + rank_var + " is not (" + style->name +
                            "-style launch needs both)");
  }
  if (!env(size_var)) {
    throw LaunchConfigError(rank_var + " is set but " + size_var + " is not (" + style->name +
                            "-style launch needs both)");
  }
  info.world_size = int_var(env, size_var, 1, kMaxWorld);
  info.rank = int_var(env, rank_var, 0, kMaxWorld);
  if (info.rank >= info.world_size) {
    throw LaunchConfigError(rank_var + "=" + std::to_string(info.rank) + " is not below " +
                            size_var + "=" + std::to_string(info.world_size));
  }
  const std::string local_var = style->local_rank;
  if (env(local_var)) {
    info.local_rank = int_var(env, local_var, 0, kMaxWorld);
    if (info.local_rank >= info.world_size) {
      throw LaunchConfigError(local_var + "=" + std::to_string(info.local_rank) + " is not below " +
                              size_var + "=" + std::to_string(info.world_size));
    }
  } else if (style->local_rank_required) {
    throw LaunchConfigError(rank_var + " is set but " + local_var + " is not");
  } else {
    info.local_rank = info.rank;
  }

  if (auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) throw LaunchConfigError("MASTER_ADDR is set but empty");
    info.master_addr = *addr;
  } else if (std::string(style->name) == "slurm") {
    if (auto node = env("SLURM_LAUNCH_NODE_IPADDR"); node && !node->empty()) {
      info.master_addr = *node;
    }
  }
  if (env("MASTER_PORT")) info.master_port = int_var(env, "MASTER_PORT", 1, 65535);
  return info;
}

std::vector<HostSlots> parse_hostfile_text(const std::string& text,
                                           const std::string& source_name) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string where = source_name + ":" + std::to_string(line_no);
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::vector<std::string> tok;
    for (std::string t; fields >> t;) tok.push_back(t);
    if (tok.empty()) continue;
    if (tok.size() != 2 || tok[1].rfind("slots=", 0) != 0) {
      throw LaunchConfigError(where + ": expected 'hostname slots=N', got '" + line + "'");
    }
    const std::string count = tok[1].substr(6);
    const auto n = to_int(count);
    if (!n || *n < 1 || *n > kMaxWorld) {
      throw LaunchConfigError(where + ": slots='" + count + "' is not a positive integer");
    }
    if (!seen.insert(tok[0]).second) {
      throw LaunchConfigError(where + ": host '" + tok[0] + "' is listed twice");
    }
    hosts.push_back({tok[0], static_cast<int>(*n)});
  }
  if (hosts.empty())
    throw LaunchConfigError(source_name + ": no hosts (every line is blank or a comment)");
  return hosts;
}

std::vector<HostSlots> parse_hostfile(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw LaunchConfigError("cannot open hostfile '" + path + "'");
  std::ostringstream text;
  text << f.rdbuf();
  return parse_hostfile_text(text.str(), path);
}

}  // namespace dsactor::deploy
