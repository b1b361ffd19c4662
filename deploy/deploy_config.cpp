#include "deploy/deploy_config.h"
#include "key_table/key_suggestion.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

namespace dsactor::deploy {

namespace fs = std::filesystem;

namespace {

constexpr unsigned kOffloadBit = 1u << 0;
constexpr unsigned kTrainerBit = 1u << 1;
constexpr unsigned kCoordinatorBit = 1u << 2;
constexpr unsigned kAllRoles = kOffloadBit | kTrainerBit | kCoordinatorBit;
constexpr int kFirstDefaultPort = 5555;

unsigned role_bit(RoleKind k) {
  switch (k) {
    case RoleKind::kOffload:
      return kOffloadBit;
    case RoleKind::kTrainer:
      return kTrainerBit;
    case RoleKind::kCoordinator:
      return kCoordinatorBit;
  }
  return 0;
}

enum class Scope { kTop, kRole, kAio };

// One row per key: the single place a key's name, scope, roles and documentation live.
struct KeySpec {
  Scope scope;
  std::string_view name;
  unsigned roles;  // for Scope::kRole / kAio: which roles may use the key
  std::string_view type;
  std::string_view default_text;
  std::string_view doc;
};

const std::vector<KeySpec>& key_table() {
  static const std::vector<KeySpec> table = {
      {Scope::kTop, "job", kAllRoles, "string", "the file's stem",
       "job id the roles register under"},
      {Scope::kTop, "roles", kAllRoles, "list", "(required)",
       "the processes of the deployment, in start order"},
      {Scope::kTop, "allow_remote", kAllRoles, "bool", "false",
       "allow `listen` on non-loopback addresses (the services have no authentication yet)"},
      {Scope::kTop, "create_dirs", kAllRoles, "bool", "true",
       "`dsactor up` creates missing `nvme` and `out` directories; false: a missing one is an "
       "error"},
      {Scope::kTop, "env", kAllRoles, "map", "{}", "environment added to every role"},
      {Scope::kTop, "rendezvous", kAllRoles, "endpoint",
       "the coordinator's `listen`; else, with world_size > 1, tcp://127.0.0.1:<first free "
       "5555+ port>",
       "where trainers rendezvous (`--coordinator`); without a coordinator role, trainer rank 0 "
       "binds it (`--serve-coordinator`). Needed when trainers on other machines take part and "
       "there is no coordinator role"},
      {Scope::kTop, "startup_timeout", kAllRoles, "seconds", "60",
       "default for every role: time a service has to answer on its endpoint"},
      {Scope::kTop, "shutdown_timeout", kAllRoles, "seconds", "10",
       "default for every role: time from SIGTERM to SIGKILL"},

      {Scope::kRole, "role", kAllRoles, "offload | trainer | coordinator", "(required)",
       "what the process runs"},
      {Scope::kRole, "name", kAllRoles, "string [A-Za-z0-9_.-]", "<role><n>",
       "unique name; the log prefix; what trainers' `offload` lists refer to"},
      {Scope::kRole, "listen", kOffloadBit | kCoordinatorBit, "endpoint", "tcp://127.0.0.1:<5555+>",
       "ZeroMQ endpoint bound (tcp://HOST:PORT or ipc://PATH)"},
      {Scope::kRole, "nvme", kOffloadBit, "path", "none (RAM tier only)",
       "directory of the NVMe tier"},
      {Scope::kRole, "memory_limit", kOffloadBit, "bytes", "0 (physical memory)",
       "RAM partitions may take; 64GiB, 512MiB, 4GB or an integer"},
      {Scope::kRole, "aio", kOffloadBit, "map", "{}",
       "io_uring overrides: block_size, queue_depth"},
      {Scope::kRole, "mlock", kOffloadBit, "bool", "true",
       "lock RAM buffers with mlock where allowed"},
      {Scope::kRole, "max_arena", kOffloadBit, "bytes", "64GiB",
       "shared-memory arenas of same-host trainers mapped at once; beyond it a trainer moves "
       "payloads as frames; 0: never map"},
      {Scope::kRole, "config", kTrainerBit, "path", "(required)",
       "the trainer's ds_config (.json or .yaml)"},
      {Scope::kRole, "model", kTrainerBit, "preset | path", "the trainer's default",
       "model preset or model YAML"},
      {Scope::kRole, "data", kTrainerBit, "path", "the trainer's default", "training data"},
      {Scope::kRole, "tokenizer", kTrainerBit, "byte or path", "byte",
       "tokenizer of text data: a GPT-2 tokenizer directory, tokenizer.json or vocab.json; "
       "recorded in the checkpoint and weights"},
      {Scope::kRole, "steps", kTrainerBit, "integer >= 1", "the trainer's default",
       "optimizer steps"},
      {Scope::kRole, "out", kTrainerBit, "path", "the trainer's default", "output directory"},
      {Scope::kRole, "rank", kTrainerBit, "integer >= 0", "trainers numbered in file order",
       "data-parallel rank"},
      {Scope::kRole, "world_size", kTrainerBit, "integer >= 1", "number of trainers in the file",
       "data-parallel world size (larger when other machines run more trainers)"},
      {Scope::kRole, "shared_memory", kTrainerBit, "bool", "true",
       "move payloads to same-host offload services through a shared-memory arena; false: as "
       "frames over the socket (lower peak memory, more CPU)"},
      {Scope::kRole, "offload", kTrainerBit, "name | list of names",
       "every offload role in the file", "offload services this trainer's partitions go to"},
      {Scope::kRole, "env", kAllRoles, "map", "{}",
       "environment added to this role (overrides the top-level env)"},
      {Scope::kRole, "startup_timeout", kAllRoles, "seconds", "top-level value",
       "see the top-level key"},
      {Scope::kRole, "shutdown_timeout", kAllRoles, "seconds", "top-level value",
       "see the top-level key"},

      {Scope::kAio, "block_size", kOffloadBit, "bytes (multiple of 4096)", "1MiB",
       "io_uring request size"},
      {Scope::kAio, "queue_depth", kOffloadBit, "integer 1..4096", "8",
       "io_uring requests in flight"},
  };
  return table;
}

std::vector<std::string> keys_of(Scope scope) {
  std::vector<std::string> out;
  for (const auto& k : key_table())
    if (k.scope == scope) out.emplace_back(k.name);
  return out;
}

const KeySpec* find_key(Scope scope, std::string_view name) {
  for (const auto& k : key_table())
    if (k.scope == scope && k.name == name) return &k;
  return nullptr;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The closest candidate, if it is close enough to be a plausible typo.
std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& cands) {
  return key_table::nearest_key(word, cands);
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& cands) {
  const auto near = nearest(word, cands);
  return near ? fmt::format(" (did you mean \"{}\"?)", *near) : std::string();
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return out;
}

std::string role_names_text(unsigned roles) {
  std::vector<std::string> out;
  if (roles & kOffloadBit) out.emplace_back("offload");
  if (roles & kTrainerBit) out.emplace_back("trainer");
  if (roles & kCoordinatorBit) out.emplace_back("coordinator");
  return joined(out);
}

// Where we are in the file, for messages: the file and the YAML node's line.
struct Ctx {
  fs::path source;
  fs::path base_dir;

  [[noreturn]] void fail(const YAML::Node& at, std::string_view path,
                         const std::string& msg) const {
    const YAML::Mark m = at.IsDefined() ? at.Mark() : YAML::Mark::null_mark();
    const std::string where =
        m.is_null() ? source.string() : fmt::format("{}:{}", source.string(), m.line + 1);
    if (path.empty()) throw DeployConfigError(fmt::format("{}: {}", where, msg));
    throw DeployConfigError(fmt::format("{}: {}: {}", where, path, msg));
  }
};

std::string shown(const YAML::Node& n) {
  if (n.IsScalar()) return fmt::format("\"{}\"", n.Scalar());
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "nothing";
}

std::string read_string(const Ctx& ctx, const YAML::Node& n, const std::string& path) {
  if (!n.IsScalar()) ctx.fail(n, path, fmt::format("expected a string, got {}", shown(n)));
  return n.Scalar();
}

bool read_bool(const Ctx& ctx, const YAML::Node& n, const std::string& path) {
  bool b = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, b))
    ctx.fail(n, path, fmt::format("expected true or false, got {}", shown(n)));
  return b;
}

int64_t read_int(const Ctx& ctx, const YAML::Node& n, const std::string& path, int64_t lo,
                 int64_t hi) {
  int64_t v = 0;
  if (n.IsScalar()) {
    const std::string& s = n.Scalar();
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size() && v >= lo && v <= hi) return v;
  }
  ctx.fail(n, path,
           hi == std::numeric_limits<int64_t>::max()
               ? fmt::format("value {} is not allowed; expected an integer >= {}", shown(n), lo)
               : fmt::format("value {} is not allowed; expected an integer in [{}, {}]", shown(n),
                             lo, hi));
}

double read_seconds(const Ctx& ctx, const YAML::Node& n, const std::string& path) {
  if (n.IsScalar()) {
    const std::string& s = n.Scalar();
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(v) && v > 0 && v <= 86400)
      return v;
  }
  ctx.fail(
      n, path,
      fmt::format("value {} is not allowed; expected seconds, a number in (0, 86400]", shown(n)));
}

uint64_t read_bytes(const Ctx& ctx, const YAML::Node& n, const std::string& path) {
  if (n.IsScalar())
    if (auto v = parse_byte_size(n.Scalar())) return *v;
  ctx.fail(n, path,
           fmt::format("value {} is not a byte count; write an integer or a number with a suffix "
                       "K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) or KB, MB, GB, TB (powers of "
                       "1000), e.g. 64GiB",
                       shown(n)));
}

fs::path resolve(const Ctx& ctx, const std::string& p) {
  fs::path path(p);
  if (!p.empty() && p[0] == '~')
    if (const char* home = std::getenv("HOME"))
      path = fs::path(home) / p.substr(p.size() > 1 ? 2 : 1);
  return (path.is_absolute() ? path : ctx.base_dir / path).lexically_normal();
}

bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

bool valid_env_name(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// Rejects keys the scope does not know, with the nearest known key, and keys of another role.
void check_keys(const Ctx& ctx, const YAML::Node& map, Scope scope, const std::string& prefix,
                std::optional<RoleKind> kind) {
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) ctx.fail(kv.first, prefix, "keys must be strings");
    const std::string key = kv.first.Scalar();
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    const KeySpec* spec = find_key(scope, key);
    if (!spec) {
      const auto known = keys_of(scope);
      ctx.fail(kv.first, path,
               fmt::format("unknown key{}; keys allowed {}: {}", did_you_mean(key, known),
                           prefix.empty() ? "at the top level" : "in " + prefix, joined(known)));
    }
    if (kind && !(spec->roles & role_bit(*kind)))
      ctx.fail(kv.first, path,
               fmt::format("key \"{}\" applies to role {}, not to role {}", key,
                           role_names_text(spec->roles), role_kind_name(*kind)));
  }
}

std::vector<std::pair<std::string, std::string>> read_env(const Ctx& ctx, const YAML::Node& n,
                                                          const std::string& path) {
  if (!n.IsMap()) ctx.fail(n, path, fmt::format("expected a map NAME: value, got {}", shown(n)));
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& kv : n) {
    const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : std::string();
    if (!valid_env_name(name))
      ctx.fail(kv.first, path,
               fmt::format("environment name {} is not allowed; expected [A-Za-z_][A-Za-z0-9_]*",
                           shown(kv.first)));
    if (!kv.second.IsScalar())
      ctx.fail(kv.second, path + "." + name,
               fmt::format("expected a string value, got {}", shown(kv.second)));
    out.emplace_back(name, kv.second.Scalar());
  }
  return out;
}

void merge_env(std::vector<std::pair<std::string, std::string>>& into,
               const std::vector<std::pair<std::string, std::string>>& more) {
  for (const auto& [k, v] : more) {
    auto it = std::find_if(into.begin(), into.end(), [&](const auto& e) { return e.first == k; });
    if (it != into.end())
      it->second = v;
    else
      into.emplace_back(k, v);
  }
}

struct Endpoint {
  std::string text;  // normalized
  bool tcp = false;
  std::string host;
  int port = 0;
};

// Splits tcp://HOST:PORT / ipc://PATH; nullopt with `why` set when it is neither.
std::optional<Endpoint> split_endpoint(std::string_view e, std::string& why) {
  Endpoint out;
  if (e.starts_with("ipc://")) {
    if (e.size() == 6) {
      why = "ipc:// needs a socket path";
      return std::nullopt;
    }
    out.text = std::string(e);
    return out;
  }
  if (!e.starts_with("tcp://")) {
    why = "only tcp://HOST:PORT and ipc://PATH endpoints are allowed";
    return std::nullopt;
  }
  const std::string_view rest = e.substr(6);
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    why = "expected tcp://HOST:PORT";
    return std::nullopt;
  }
  out.tcp = true;
  out.host = std::string(rest.substr(0, colon));
  const std::string_view port = rest.substr(colon + 1);
  if (port == "*" || port == "0") {
    why = "a wildcard port cannot be handed to the trainers; name a port";
    return std::nullopt;
  }
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), out.port);
  if (ec != std::errc() || end != port.data() + port.size() || out.port < 1 || out.port > 65535) {
    why = "the port must be an integer in [1, 65535]";
    return std::nullopt;
  }
  if (lower(out.host) == "localhost") out.host = "127.0.0.1";
  out.text = fmt::format("tcp://{}:{}", out.host, out.port);
  return out;
}

RoleKind read_kind(const Ctx& ctx, const YAML::Node& n, const std::string& path) {
  static const std::vector<std::string> kinds = {"offload", "trainer", "coordinator"};
  if (!n.IsDefined())
    ctx.fail(n, path, "missing; every entry of roles needs role: offload | trainer | coordinator");
  const std::string s = read_string(ctx, n, path);
  if (s == "offload") return RoleKind::kOffload;
  if (s == "trainer") return RoleKind::kTrainer;
  if (s == "coordinator") return RoleKind::kCoordinator;
  ctx.fail(n, path,
           fmt::format("unknown role \"{}\"; allowed: offload, trainer, coordinator{}", s,
                       did_you_mean(s, kinds)));
}

}  // namespace

std::string_view role_kind_name(RoleKind k) {
  switch (k) {
    case RoleKind::kOffload:
      return "offload";
    case RoleKind::kTrainer:
      return "trainer";
    case RoleKind::kCoordinator:
      return "coordinator";
  }
  return "?";
}

const RoleSpec* DeployConfig::find(std::string_view name) const {
  for (const auto& r : roles)
    if (r.name == name) return &r;
  return nullptr;
}

std::vector<const RoleSpec*> DeployConfig::of_kind(RoleKind k) const {
  std::vector<const RoleSpec*> out;
  for (const auto& r : roles)
    if (r.kind == k) out.push_back(&r);
  return out;
}

std::optional<uint64_t> parse_byte_size(std::string_view text) {
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return std::nullopt;
  const std::string number(text.substr(0, i));
  std::string suffix = lower(text.substr(i));
  while (!suffix.empty() && suffix.front() == ' ') suffix.erase(0, 1);
  static const std::array<std::pair<std::string_view, double>, 14> units = {{
      {"", 1.0},
      {"b", 1.0},
      {"k", 1024.0},
      {"kib", 1024.0},
      {"m", 1048576.0},
      {"mib", 1048576.0},
      {"g", 1073741824.0},
      {"gib", 1073741824.0},
      {"t", 1099511627776.0},
      {"tib", 1099511627776.0},
      {"kb", 1e3},
      {"mb", 1e6},
      {"gb", 1e9},
      {"tb", 1e12},
  }};
  for (const auto& [name, mult] : units) {
    if (suffix != name) continue;
    if (number.find('.') == std::string::npos) {
      uint64_t v = 0;
      const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
      if (ec != std::errc() || end != number.data() + number.size()) return std::nullopt;
      const auto m = static_cast<uint64_t>(mult);
      if (v != 0 && m > std::numeric_limits<uint64_t>::max() / v) return std::nullopt;
      return v * m;
    }
    // "1.5GiB": a fraction is fine as long as it comes out a whole number of bytes.
    char* end = nullptr;
    const double d = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size() || !std::isfinite(d)) return std::nullopt;
    const double bytes = d * mult;
    if (bytes != std::floor(bytes) || bytes >= 1.8e19) return std::nullopt;
    return static_cast<uint64_t>(bytes);
  }
  return std::nullopt;
}

bool is_loopback_endpoint(std::string_view endpoint) {
  std::string why;
  const auto e = split_endpoint(endpoint, why);
  if (!e || !e->tcp) return e.has_value();  // ipc:// is local by construction
  std::string host = e->host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host.starts_with("127.") || host == "::1" || host == "lo";
}

DeployConfig parse_deploy_config(const std::string& yaml_text, const fs::path& source) {
  Ctx ctx{source, source.has_parent_path() ? source.parent_path() : fs::current_path()};
  YAML::Node loaded;
  try {
    loaded = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw DeployConfigError(fmt::format("{}:{}:{}: not valid YAML: {}", source.string(),
                                        e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  // Only const access from here on: yaml-cpp's non-const operator[] inserts missing keys.
  const YAML::Node root = loaded;
  if (!root.IsMap())
    ctx.fail(root, "", "expected a map with at least `roles:` (see docs/deploy.md)");
  check_keys(ctx, root, Scope::kTop, "", std::nullopt);

  DeployConfig cfg;
  cfg.source = source;
  cfg.job = root["job"] ? read_string(ctx, root["job"], "job") : source.stem().string();
  if (!valid_name(cfg.job))
    ctx.fail(root["job"], "job",
             fmt::format("value \"{}\" is not allowed; expected 1-64 of [A-Za-z0-9_.-]", cfg.job));
  if (root["allow_remote"]) cfg.allow_remote = read_bool(ctx, root["allow_remote"], "allow_remote");
  if (root["create_dirs"]) cfg.create_dirs = read_bool(ctx, root["create_dirs"], "create_dirs");
  std::vector<std::pair<std::string, std::string>> top_env;
  if (root["env"]) top_env = read_env(ctx, root["env"], "env");
  double startup_timeout = 60, shutdown_timeout = 10;
  if (root["startup_timeout"])
    startup_timeout = read_seconds(ctx, root["startup_timeout"], "startup_timeout");
  if (root["shutdown_timeout"])
    shutdown_timeout = read_seconds(ctx, root["shutdown_timeout"], "shutdown_timeout");

  const YAML::Node roles = root["roles"];
  if (!roles)
    ctx.fail(root, "roles", "missing; list the processes to run, e.g. roles: [{role: offload}]");
  if (!roles.IsSequence() || roles.size() == 0)
    ctx.fail(roles, "roles",
             fmt::format("expected a non-empty list of roles, got {}", shown(roles)));

  // Nodes kept for second-pass messages (duplicates, references) that point at a line.
  std::vector<YAML::Node> role_nodes_storage;
  const auto& role_nodes = role_nodes_storage;
  std::map<RoleKind, int> per_kind;
  for (size_t i = 0; i < roles.size(); ++i) {
    const YAML::Node n = roles[i];
    const std::string p = fmt::format("roles[{}]", i);
    if (!n.IsMap())
      ctx.fail(n, p,
               fmt::format("expected a map with role: offload | trainer | coordinator, got {}",
                           shown(n)));
    RoleSpec r;
    r.index = i;
    r.kind = read_kind(ctx, n["role"], p + ".role");
    check_keys(ctx, n, Scope::kRole, p, r.kind);
    const int nth = per_kind[r.kind]++;
    r.name = n["name"] ? read_string(ctx, n["name"], p + ".name")
                       : fmt::format("{}{}", role_kind_name(r.kind), nth);
    if (!valid_name(r.name))
      ctx.fail(n["name"], p + ".name",
               fmt::format("value \"{}\" is not allowed; expected 1-64 of [A-Za-z0-9_.-]", r.name));
    if (n["listen"]) r.listen = read_string(ctx, n["listen"], p + ".listen");
    if (n["nvme"]) r.nvme = resolve(ctx, read_string(ctx, n["nvme"], p + ".nvme"));
    if (n["memory_limit"]) r.memory_limit = read_bytes(ctx, n["memory_limit"], p + ".memory_limit");
    if (n["mlock"]) r.mlock = read_bool(ctx, n["mlock"], p + ".mlock");
    if (n["max_arena"]) r.max_arena = read_bytes(ctx, n["max_arena"], p + ".max_arena");
    if (n["shared_memory"])
      r.shared_memory = read_bool(ctx, n["shared_memory"], p + ".shared_memory");
    if (const YAML::Node aio = n["aio"]) {
      if (!aio.IsMap())
        ctx.fail(aio, p + ".aio", fmt::format("expected a map, got {}", shown(aio)));
      check_keys(ctx, aio, Scope::kAio, p + ".aio", r.kind);
      if (aio["block_size"]) {
        const uint64_t b = read_bytes(ctx, aio["block_size"], p + ".aio.block_size");
        if (b == 0 || b % 4096 != 0 || b > (uint64_t{1} << 30))
          ctx.fail(
              aio["block_size"], p + ".aio.block_size",
              fmt::format("value {} is not allowed; expected a multiple of 4096 up to 1GiB", b));
        r.aio.block_size = b;
      }
      if (aio["queue_depth"])
        r.aio.queue_depth = static_cast<unsigned>(
            read_int(ctx, aio["queue_depth"], p + ".aio.queue_depth", 1, 4096));
    }
    if (n["config"]) {
      r.config = resolve(ctx, read_string(ctx, n["config"], p + ".config"));
      if (!fs::is_regular_file(r.config))
        ctx.fail(n["config"], p + ".config",
                 fmt::format("ds_config {} does not exist (relative paths are resolved against {})",
                             r.config.string(), ctx.base_dir.string()));
    } else if (r.kind == RoleKind::kTrainer) {
      ctx.fail(n, p + ".config",
               "missing; a trainer needs its ds_config, e.g. config: ds_config.json");
    }
    if (n["model"]) {
      r.model = read_string(ctx, n["model"], p + ".model");
      // A preset is a bare word; anything that looks like a file is one, found where the
      // deploy file is.
      if (r.model.find('/') != std::string::npos || r.model.ends_with(".yaml") ||
          r.model.ends_with(".yml"))
        r.model = resolve(ctx, r.model).string();
    }
    if (n["data"]) r.data = resolve(ctx, read_string(ctx, n["data"], p + ".data")).string();
    if (n["tokenizer"]) {
      r.tokenizer = read_string(ctx, n["tokenizer"], p + ".tokenizer");
      if (r.tokenizer != "byte") r.tokenizer = resolve(ctx, r.tokenizer).string();
    }
    if (n["out"]) r.out = resolve(ctx, read_string(ctx, n["out"], p + ".out")).string();
    if (n["steps"])
      r.steps = read_int(ctx, n["steps"], p + ".steps", 1, std::numeric_limits<int64_t>::max());
    r.env = top_env;
    if (n["env"]) merge_env(r.env, read_env(ctx, n["env"], p + ".env"));
    r.startup_timeout = n["startup_timeout"]
                            ? read_seconds(ctx, n["startup_timeout"], p + ".startup_timeout")
                            : startup_timeout;
    r.shutdown_timeout = n["shutdown_timeout"]
                             ? read_seconds(ctx, n["shutdown_timeout"], p + ".shutdown_timeout")
                             : shutdown_timeout;
    cfg.roles.push_back(std::move(r));
    role_nodes_storage.push_back(n);
  }

  // Names are what logs, exit messages and `offload:` lists refer to: they must be unique.
  std::map<std::string, size_t> by_name;
  for (const auto& r : cfg.roles) {
    const auto [it, fresh] = by_name.emplace(r.name, r.index);
    if (!fresh) {
      const YAML::Node n = role_nodes[r.index];
      ctx.fail(n["name"] ? n["name"] : n, fmt::format("roles[{}].name", r.index),
               fmt::format("duplicate name \"{}\" (also roles[{}]); every role needs its own name",
                           r.name, it->second));
    }
  }
  if (cfg.of_kind(RoleKind::kCoordinator).size() > 1) {
    const auto* second = cfg.of_kind(RoleKind::kCoordinator)[1];
    ctx.fail(role_nodes[second->index], fmt::format("roles[{}].role", second->index),
             "a deployment has at most one coordinator");
  }

  // Endpoints: explicit ones first (validated, loopback unless allowed), then defaults on
  // the first free ports from 5555.
  std::map<std::string, size_t> by_endpoint;
  std::set<int> used_ports;
  for (auto& r : cfg.roles) {
    if (r.listen.empty()) continue;
    const YAML::Node n = role_nodes[r.index]["listen"];
    const std::string p = fmt::format("roles[{}].listen", r.index);
    std::string why;
    auto e = split_endpoint(r.listen, why);
    if (!e) ctx.fail(n, p, fmt::format("value \"{}\" is not allowed: {}", r.listen, why));
    if (!e->tcp) {
      // ZeroMQ resolves a relative ipc path against the binding process's cwd; anchor it at
      // the deploy file like every other path.
      const std::string path = e->text.substr(6);
      e->text = "ipc://" + resolve(ctx, path).string();
    }
    if (e->tcp && !cfg.allow_remote && !is_loopback_endpoint(e->text))
      ctx.fail(n, p,
               fmt::format("value \"{}\" listens beyond this machine (host \"{}\"); the services "
                           "have no authentication, so only loopback (127.0.0.1, ::1) is allowed "
                           "unless the top level sets allow_remote: true",
                           r.listen, e->host));
    r.listen = e->text;
    if (e->tcp) used_ports.insert(e->port);
    const auto [it, fresh] = by_endpoint.emplace(r.listen, r.index);
    if (!fresh)
      ctx.fail(n, p,
               fmt::format("duplicate endpoint \"{}\" (also roles[{}] \"{}\"); each service needs "
                           "its own",
                           r.listen, it->second, cfg.roles[it->second].name));
  }
  // An explicit rendezvous endpoint: validated like a listen address, and its port kept out
  // of the defaults below. Whether something here binds it is decided once ranks are known.
  std::optional<Endpoint> rendezvous_key;
  if (const YAML::Node n = root["rendezvous"]) {
    const std::string text = read_string(ctx, n, "rendezvous");
    if (!cfg.of_kind(RoleKind::kCoordinator).empty())
      ctx.fail(n, "rendezvous",
               fmt::format("value \"{}\" is not allowed with a coordinator role: the "
                           "coordinator's listen is the rendezvous; remove one of them",
                           text));
    std::string why;
    rendezvous_key = split_endpoint(text, why);
    if (!rendezvous_key)
      ctx.fail(n, "rendezvous", fmt::format("value \"{}\" is not allowed: {}", text, why));
    if (!rendezvous_key->tcp)
      rendezvous_key->text = "ipc://" + resolve(ctx, rendezvous_key->text.substr(6)).string();
    if (const auto it = by_endpoint.find(rendezvous_key->text); it != by_endpoint.end())
      ctx.fail(n, "rendezvous",
               fmt::format("endpoint \"{}\" is also roles[{}] \"{}\"'s listen; the rendezvous "
                           "needs its own",
                           rendezvous_key->text, it->second, cfg.roles[it->second].name));
    if (rendezvous_key->tcp) used_ports.insert(rendezvous_key->port);
  }
  int next_port = kFirstDefaultPort;
  for (auto& r : cfg.roles) {
    if (r.kind == RoleKind::kTrainer || !r.listen.empty()) continue;
    while (used_ports.count(next_port)) ++next_port;
    used_ports.insert(next_port);
    r.listen = fmt::format("tcp://127.0.0.1:{}", next_port);
  }

  for (const auto& r : cfg.roles) {
    if (!r.nvme || cfg.create_dirs) continue;
    const YAML::Node n = role_nodes[r.index]["nvme"];
    const std::string p = fmt::format("roles[{}].nvme", r.index);
    if (!fs::exists(*r.nvme))
      ctx.fail(n, p,
               fmt::format("directory {} does not exist and create_dirs is false; create it or "
                           "set create_dirs: true (relative paths are resolved against {})",
                           r.nvme->string(), ctx.base_dir.string()));
    if (!fs::is_directory(*r.nvme))
      ctx.fail(n, p, fmt::format("{} exists but is not a directory", r.nvme->string()));
  }

  // Trainers: which services their partitions go to, and their place in the world.
  std::vector<std::string> offload_names;
  for (const auto* o : cfg.of_kind(RoleKind::kOffload)) offload_names.push_back(o->name);
  std::vector<RoleSpec*> trainers;
  for (auto& r : cfg.roles)
    if (r.kind == RoleKind::kTrainer) trainers.push_back(&r);
  for (auto* t : trainers) {
    const YAML::Node n = role_nodes[t->index]["offload"];
    const std::string p = fmt::format("roles[{}].offload", t->index);
    if (!n) {
      t->offload = offload_names;
      continue;
    }
    std::vector<YAML::Node> items;
    if (n.IsScalar()) {
      items.push_back(n);
    } else if (n.IsSequence() && n.size() > 0) {
      for (const auto& e : n) items.push_back(e);
    } else {
      ctx.fail(n, p,
               fmt::format("expected an offload role's name or a list of them, got {}", shown(n)));
    }
    for (const auto& e : items) {
      const std::string name = read_string(ctx, e, p);
      const RoleSpec* target = cfg.find(name);
      if (!target)
        ctx.fail(e, p,
                 fmt::format("unknown offload service \"{}\"{}; offload roles here: {}", name,
                             did_you_mean(name, offload_names),
                             offload_names.empty() ? std::string("none") : joined(offload_names)));
      if (target->kind != RoleKind::kOffload)
        ctx.fail(e, p,
                 fmt::format("\"{}\" is a {} role, not an offload service; offload roles here: {}",
                             name, role_kind_name(target->kind),
                             offload_names.empty() ? std::string("none") : joined(offload_names)));
      if (std::find(t->offload.begin(), t->offload.end(), name) != t->offload.end())
        ctx.fail(e, p, fmt::format("\"{}\" is listed twice", name));
      t->offload.push_back(name);
    }
  }

  // Ranks: explicit world sizes must agree (other machines may run the other ranks);
  // unnumbered trainers take the lowest free ranks in file order.
  std::optional<int> world;
  for (auto* t : trainers) {
    const YAML::Node n = role_nodes[t->index]["world_size"];
    if (!n) continue;
    const int w = static_cast<int>(
        read_int(ctx, n, fmt::format("roles[{}].world_size", t->index), 1, 1 << 20));
    if (world && *world != w)
      ctx.fail(n, fmt::format("roles[{}].world_size", t->index),
               fmt::format("value {} differs from world_size {} given earlier; all trainers of a "
                           "job share one world size",
                           w, *world));
    world = w;
  }
  const int world_size = world.value_or(static_cast<int>(trainers.size()));
  if (!trainers.empty() && world_size < static_cast<int>(trainers.size()))
    ctx.fail(role_nodes[trainers.front()->index]["world_size"],
             fmt::format("roles[{}].world_size", trainers.front()->index),
             fmt::format("value {} is smaller than the {} trainers this file starts", world_size,
                         trainers.size()));
  std::map<int, size_t> by_rank;
  for (auto* t : trainers) {
    t->world_size = world_size;
    const YAML::Node n = role_nodes[t->index]["rank"];
    if (!n) continue;
    const std::string p = fmt::format("roles[{}].rank", t->index);
    t->rank = static_cast<int>(read_int(ctx, n, p, 0, world_size - 1));
    const auto [it, fresh] = by_rank.emplace(t->rank, t->index);
    if (!fresh)
      ctx.fail(n, p, fmt::format("duplicate rank {} (also roles[{}])", t->rank, it->second));
  }
  int next_rank = 0;
  for (auto* t : trainers) {
    if (role_nodes[t->index]["rank"]) continue;
    while (by_rank.count(next_rank)) ++next_rank;
    t->rank = next_rank;
    by_rank.emplace(next_rank, t->index);
  }

  // Rendezvous: the coordinator, else the explicit key, else an implicit loopback endpoint
  // that trainer rank 0 binds. Loopback only works when every rank runs from this file.
  const bool rank0_here = by_rank.count(0) > 0;
  if (const auto coordinators = cfg.of_kind(RoleKind::kCoordinator); !coordinators.empty()) {
    cfg.rendezvous = coordinators.front()->listen;
  } else if (rendezvous_key) {
    cfg.rendezvous = rendezvous_key->text;
    cfg.rendezvous_in_rank0 = rank0_here;
    if (rank0_here && rendezvous_key->tcp && !cfg.allow_remote &&
        !is_loopback_endpoint(cfg.rendezvous))
      ctx.fail(root["rendezvous"], "rendezvous",
               fmt::format("value \"{}\" makes trainer rank 0 listen beyond this machine; the "
                           "store has no authentication, so this needs allow_remote: true",
                           cfg.rendezvous));
  } else if (world_size > 1 && !trainers.empty()) {
    if (!rank0_here || static_cast<int>(trainers.size()) < world_size)
      ctx.fail(role_nodes[trainers.front()->index],
               fmt::format("roles[{}]", trainers.front()->index),
               fmt::format("world_size {} but this file runs {} trainer(s){}: trainers on other "
                           "machines cannot reach an implicit loopback rendezvous; add a "
                           "coordinator role they can reach, or set the top-level rendezvous: "
                           "tcp://HOST:PORT",
                           world_size, trainers.size(), rank0_here ? "" : " and not rank 0"));
    while (used_ports.count(next_port)) ++next_port;
    cfg.rendezvous = fmt::format("tcp://127.0.0.1:{}", next_port);
    cfg.rendezvous_in_rank0 = true;
  }
  return cfg;
}

DeployConfig load_deploy_config(const fs::path& path) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  if (ec) abs = path;
  abs = abs.lexically_normal();
  std::ifstream in(abs);
  if (!in)
    throw DeployConfigError(
        fmt::format("{}: cannot read the deploy file (does it exist?)", abs.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_deploy_config(ss.str(), abs);
}

std::vector<std::string> to_command_line(const DeployConfig& config, const RoleSpec& role) {
  std::vector<std::string> a = {"start", "--role", std::string(role_kind_name(role.kind))};
  switch (role.kind) {
    case RoleKind::kOffload:
      a.insert(a.end(), {"--listen", role.listen});
      if (role.nvme) a.insert(a.end(), {"--nvme", role.nvme->string()});
      if (role.memory_limit)
        a.insert(a.end(), {"--memory-limit", std::to_string(role.memory_limit)});
      if (role.aio.block_size)
        a.insert(a.end(), {"--aio-block-size", std::to_string(*role.aio.block_size)});
      if (role.aio.queue_depth)
        a.insert(a.end(), {"--aio-queue-depth", std::to_string(*role.aio.queue_depth)});
      if (!role.mlock) a.emplace_back("--no-mlock");
      if (role.max_arena) a.insert(a.end(), {"--max-arena", std::to_string(*role.max_arena)});
      break;
    case RoleKind::kTrainer:
      a.insert(a.end(), {"--name", role.name, "--deploy", config.source.string(), "--config",
                         role.config.string(), "--rank", std::to_string(role.rank), "--world-size",
                         std::to_string(role.world_size)});
      for (const auto& name : role.offload)
        if (const RoleSpec* o = config.find(name)) a.insert(a.end(), {"--offload", o->listen});
      if (!role.model.empty()) a.insert(a.end(), {"--model", role.model});
      if (!role.data.empty()) a.insert(a.end(), {"--data", role.data});
      if (!role.tokenizer.empty()) a.insert(a.end(), {"--tokenizer", role.tokenizer});
      if (role.steps) a.insert(a.end(), {"--steps", std::to_string(role.steps)});
      if (!role.out.empty()) a.insert(a.end(), {"--out", role.out});
      if (!role.shared_memory) a.emplace_back("--no-shared-memory");
      if (!config.rendezvous.empty()) {
        a.insert(a.end(), {"--coordinator", config.rendezvous});
        if (config.rendezvous_in_rank0 && role.rank == 0) a.emplace_back("--serve-coordinator");
      }
      break;
    case RoleKind::kCoordinator:
      a.insert(a.end(),
               {"--name", role.name, "--deploy", config.source.string(), "--listen", role.listen});
      break;
  }
  return a;
}

std::string deploy_reference_markdown() {
  std::string out =
      "# Deployment file (deploy.yaml)\n\n"
      "Generated from deploy/deploy_config.cpp (key_table()). Relative paths are resolved "
      "against the deploy file's directory.\n";
  const std::array<std::pair<Scope, std::string_view>, 3> sections = {
      {{Scope::kTop, "Top level"},
       {Scope::kRole, "Each entry of `roles:`"},
       {Scope::kAio, "`aio:` of an offload role"}}};
  for (const auto& [scope, title] : sections) {
    out += fmt::format(
        "\n## {}\n\n| key | roles | type | default | meaning |\n|---|---|---|---|---|\n", title);
    for (const auto& k : key_table())
      if (k.scope == scope)
        out += fmt::format("| `{}` | {} | {} | {} | {} |\n", k.name,
                           k.roles == kAllRoles ? std::string("all") : role_names_text(k.roles),
                           k.type, k.default_text, k.doc);
  }
  return out;
}

}  // namespace dsactor::deploy
