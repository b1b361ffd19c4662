// Reading a deployment: parse_deploy_config runs the steps below in order, each over the
// roles read so far. The keys and their checks are the table's (deploy_keys.cpp, read
// through deploy_yaml.h); what is here is what spans keys and roles: names, endpoints and
// default ports, the trainers' offload lists, ranks and the rendezvous.
#include "deploy/deploy_config.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "deploy/deploy_endpoint.h"
#include "deploy/deploy_restart.h"
#include "deploy/deploy_yaml.h"
#include "key_table/key_suggestion.h"
#include "metrics/http_server.h"

namespace dsactor::deploy {

namespace fs = std::filesystem;

namespace {

std::string names_or_none(const std::vector<std::string>& names) {
  return names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "));
}

void merge_env(EnvList& into, const EnvList& more) {
  for (const auto& kv : more) {  // not a structured binding: clang 14 (the fuzz build)
    auto it =
        std::find_if(into.begin(), into.end(), [&](const auto& e) { return e.first == kv.first; });
    if (it != into.end())
      it->second = kv.second;
    else
      into.push_back(kv);
  }
}

YAML::Node load_yaml(const std::string& text, const fs::path& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw DeployConfigError(fmt::format("{}:{}:{}: not valid YAML: {}", source.string(),
                                        e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

class DeployParser {
 public:
  DeployParser(const std::string& text, const fs::path& source)
      : yaml_(source), root_(load_yaml(text, source)) {
    cfg_.source = source;
  }

  DeployConfig run() {
    read_top_level();
    read_roles();
    check_names();
    bind_explicit_endpoints();
    read_rendezvous_key();
    assign_default_ports();
    check_nvme_dirs();
    resolve_offload_lists();
    assign_ranks();
    choose_rendezvous();
    check_security();
    check_restart_policies(yaml_, cfg_, role_nodes_);
    return std::move(cfg_);
  }

 private:
  // Only const access to the document: yaml-cpp's non-const operator[] inserts missing keys.
  const YAML::Node& root() const { return root_; }
  const YAML::Node& node_of(const RoleSpec& r) const { return role_nodes_[r.index]; }
  std::vector<RoleSpec*> trainers() {
    std::vector<RoleSpec*> out;
    for (auto& r : cfg_.roles)
      if (r.kind == RoleKind::kTrainer) out.push_back(&r);
    return out;
  }

  void read_top_level();
  void read_checkpoint_key();
  void read_roles();
  RoleSpec read_role(const YAML::Node& n, size_t index, std::map<RoleKind, int>& per_kind);
  void read_offload_keys(const YAML::Node& n, const std::string& p, RoleSpec& r);
  std::string read_metrics_address(const YAML::Node& n, const std::string& path);
  void read_trainer_keys(const YAML::Node& n, const std::string& p, RoleSpec& r);
  void check_names();
  void bind_explicit_endpoints();
  void read_rendezvous_key();
  void assign_default_ports();
  void check_nvme_dirs();
  void resolve_offload_lists();
  std::vector<std::string> offload_list(const YAML::Node& n, const std::string& p,
                                        const std::vector<std::string>& offload_names);
  void assign_ranks();
  void choose_rendezvous();
  void read_security();
  void read_key_files(const YAML::Node& n, const std::string& p, RoleSpec& r);
  void check_security();

  DeployYaml yaml_;
  const YAML::Node root_;
  DeployConfig cfg_;
  RoleSpec role_defaults_;              // what the top level sets for every role (env, timeouts)
  std::vector<YAML::Node> role_nodes_;  // by RoleSpec::index, for messages that name a line
  std::map<std::string, size_t> by_endpoint_;
  std::set<int> used_ports_;
  std::optional<Endpoint> rendezvous_key_;
  int next_port_ = kFirstDefaultPort;
  std::map<int, size_t> by_rank_;
  int world_size_ = 0;
};

void DeployParser::read_top_level() {
  if (!root().IsMap())
    yaml_.fail(root(), "", "expected a map with at least `roles:` (see docs/deploy.md)");
  yaml_.check_keys(root(), "", std::nullopt);
  cfg_.job =
      yaml_.name(root()["job"], "job",
                 root()["job"] ? yaml_.string(root()["job"], "job") : cfg_.source.stem().string());
  if (const auto& n = root()["allow_remote"]) cfg_.allow_remote = yaml_.boolean(n, "allow_remote");
  if (const auto& n = root()["create_dirs"]) cfg_.create_dirs = yaml_.boolean(n, "create_dirs");
  if (const auto& n = root()["env"]) role_defaults_.env = yaml_.env(n, "env");
  if (const auto& n = root()["startup_timeout"])
    role_defaults_.startup_timeout = yaml_.seconds(n, "startup_timeout");
  if (const auto& n = root()["shutdown_timeout"])
    role_defaults_.shutdown_timeout = yaml_.seconds(n, "shutdown_timeout");
  read_restart_keys(yaml_, root(), "", role_defaults_);
  if (const auto& n = root()["dashboard_listen"]) {
    const std::string text = yaml_.string(n, "dashboard_listen");
    cfg_.dashboard_listen = text == "none" ? "" : read_metrics_address(n, "dashboard_listen");
  }
  read_checkpoint_key();
  read_security();
}

void DeployParser::read_checkpoint_key() {
  const YAML::Node c = root()["checkpoint"];
  if (!c) return;
  if (!c.IsMap())
    yaml_.fail(c, "checkpoint", fmt::format("expected a map, got {}", DeployYaml::shown(c)));
  yaml_.check_keys(c, "checkpoint", std::nullopt);
  if (c["every"]) cfg_.checkpoint.every = yaml_.integer(c["every"], "checkpoint.every");
  if (c["keep_last"])
    cfg_.checkpoint.keep_last = yaml_.integer(c["keep_last"], "checkpoint.keep_last");
  if (c["dir"]) cfg_.checkpoint.dir = yaml_.path(c["dir"], "checkpoint.dir");
}

void DeployParser::read_security() {
  const YAML::Node n = root()["security"];
  if (!n) return;
  if (!n.IsMap())
    yaml_.fail(n, "security", fmt::format("expected a map, got {}", DeployYaml::shown(n)));
  yaml_.check_keys(n, "security", std::nullopt);
  DeploySecurity& s = cfg_.security;
  if (n["insecure"]) s.insecure = yaml_.boolean(n["insecure"], "security.insecure");
  if (n["keys_dir"]) s.keys_dir = yaml_.path(n["keys_dir"], "security.keys_dir");
  if (n["job_token_file"])
    s.job_token_file = yaml_.path(n["job_token_file"], "security.job_token_file");
  if (n["coordinator_key"])
    s.coordinator_key = yaml_.path(n["coordinator_key"], "security.coordinator_key");
  if (s.insecure && cfg_.allow_remote)
    yaml_.fail(root()["allow_remote"], "allow_remote",
               "value true is not allowed with security.insecure: a listener beyond this "
               "machine needs keys (remove `insecure`, and `dsactor up` makes them)");
}

// Key files given by hand for one role (keys distributed to several machines).
void DeployParser::read_key_files(const YAML::Node& n, const std::string& p, RoleSpec& r) {
  if (n["secret_key"]) {
    r.secret_key = yaml_.path(n["secret_key"], p + ".secret_key");
    r.own_key_files = true;
  }
  if (n["public_key"]) r.public_key = yaml_.path(n["public_key"], p + ".public_key");
  if (n["authorized_keys"])
    r.authorized_keys = yaml_.path(n["authorized_keys"], p + ".authorized_keys");
}

void DeployParser::read_roles() {
  const YAML::Node roles = root()["roles"];
  if (!roles)
    yaml_.fail(root(), "roles",
               "missing; list the processes to run, e.g. roles: [{role: offload}]");
  if (!roles.IsSequence() || roles.size() == 0)
    yaml_.fail(roles, "roles",
               fmt::format("expected a non-empty list of roles, got {}", DeployYaml::shown(roles)));
  std::map<RoleKind, int> per_kind;
  for (size_t i = 0; i < roles.size(); ++i) {
    const YAML::Node n = roles[i];
    cfg_.roles.push_back(read_role(n, i, per_kind));
    role_nodes_.push_back(n);
  }
}

RoleSpec DeployParser::read_role(const YAML::Node& n, size_t index,
                                 std::map<RoleKind, int>& per_kind) {
  const std::string p = fmt::format("roles[{}]", index);
  if (!n.IsMap())
    yaml_.fail(n, p,
               fmt::format("expected a map with role: offload | trainer | coordinator, got {}",
                           DeployYaml::shown(n)));
  RoleSpec r = role_defaults_;
  r.index = index;
  r.kind = yaml_.role_kind(n, p);
  yaml_.check_keys(n, p, r.kind);
  const int nth = per_kind[r.kind]++;
  r.name = yaml_.name(n["name"], p + ".name",
                      n["name"] ? yaml_.string(n["name"], p + ".name")
                                : fmt::format("{}{}", role_kind_name(r.kind), nth));
  if (n["listen"]) r.listen = yaml_.string(n["listen"], p + ".listen");
  if (n["metrics_listen"])
    r.metrics_listen = read_metrics_address(n["metrics_listen"], p + ".metrics_listen");
  read_offload_keys(n, p, r);
  read_trainer_keys(n, p, r);
  read_key_files(n, p, r);
  if (n["env"]) merge_env(r.env, yaml_.env(n["env"], p + ".env"));
  if (n["startup_timeout"])
    r.startup_timeout = yaml_.seconds(n["startup_timeout"], p + ".startup_timeout");
  if (n["shutdown_timeout"])
    r.shutdown_timeout = yaml_.seconds(n["shutdown_timeout"], p + ".shutdown_timeout");
  read_restart_keys(yaml_, n, p + ".", r);
  return r;
}

// A metrics or dashboard address: HOST:PORT, off loopback only with allow_remote (`up`
// then gives the servers a token, which it prints).
std::string DeployParser::read_metrics_address(const YAML::Node& n, const std::string& path) {
  const std::string text = yaml_.string(n, path);
  metrics::ListenAddress at;
  try {
    at = metrics::parse_listen_address(text, path);
  } catch (const std::invalid_argument& e) {
    yaml_.fail(n, path, e.what());
  }
  if (!metrics::is_loopback(at.host) && !cfg_.allow_remote)
    yaml_.fail(n, path,
               fmt::format("\"{}\" is off loopback: that needs allow_remote: true (dsactor up "
                           "then makes a metrics token and prints it); or use 127.0.0.1:PORT",
                           text));
  return text;
}

// The keys check_keys let through only for offload roles.
void DeployParser::read_offload_keys(const YAML::Node& n, const std::string& p, RoleSpec& r) {
  if (n["nvme"]) r.nvme = yaml_.path(n["nvme"], p + ".nvme");
  if (n["memory_limit"]) r.memory_limit = yaml_.bytes(n["memory_limit"], p + ".memory_limit");
  if (n["mlock"]) r.mlock = yaml_.boolean(n["mlock"], p + ".mlock");
  if (n["max_arena"]) r.max_arena = yaml_.bytes(n["max_arena"], p + ".max_arena");
  if (n["buffer_count"])
    r.buffer_count = static_cast<unsigned>(yaml_.integer(n["buffer_count"], p + ".buffer_count"));
  const YAML::Node aio = n["aio"];
  if (!aio) return;
  if (!aio.IsMap())
    yaml_.fail(aio, p + ".aio", fmt::format("expected a map, got {}", DeployYaml::shown(aio)));
  yaml_.check_keys(aio, p + ".aio", r.kind);
  if (aio["block_size"]) {
    const std::string bp = p + ".aio.block_size";
    const uint64_t b = yaml_.bytes(aio["block_size"], bp);
    if (b == 0 || b % 4096 != 0 || b > (uint64_t{1} << 30))
      yaml_.not_allowed(aio["block_size"], bp, std::to_string(b));
    r.aio.block_size = b;
  }
  if (aio["queue_depth"])
    r.aio.queue_depth =
        static_cast<unsigned>(yaml_.integer(aio["queue_depth"], p + ".aio.queue_depth"));
  if (aio["single_submit"])
    r.aio.single_submit = yaml_.boolean(aio["single_submit"], p + ".aio.single_submit");
  if (aio["overlap_events"])
    r.aio.overlap_events = yaml_.boolean(aio["overlap_events"], p + ".aio.overlap_events");
}

// The keys check_keys let through only for trainer roles (but `config`, which a trainer
// must have). rank, world_size and offload wait for assign_ranks / resolve_offload_lists.
void DeployParser::read_trainer_keys(const YAML::Node& n, const std::string& p, RoleSpec& r) {
  if (n["config"]) {
    r.config = yaml_.path(n["config"], p + ".config");
    std::error_code ec;  // a path the system cannot even look at is one that does not exist
    if (!fs::is_regular_file(r.config, ec))
      yaml_.fail(n["config"], p + ".config",
                 fmt::format("ds_config {} does not exist (relative paths are resolved against {})",
                             r.config.string(), yaml_.base_dir().string()));
  } else if (r.kind == RoleKind::kTrainer) {
    yaml_.fail(n, p + ".config",
               "missing; a trainer needs its ds_config, e.g. config: ds_config.json");
  }
  if (n["model"]) {
    r.model = yaml_.string(n["model"], p + ".model");
    // A preset is a bare word; anything that looks like a file is one, found where the
    // deploy file is.
    if (r.model.find('/') != std::string::npos || r.model.ends_with(".yaml") ||
        r.model.ends_with(".yml"))
      r.model = yaml_.resolve(r.model).string();
  }
  if (n["data"]) r.data = yaml_.path(n["data"], p + ".data").string();
  if (n["tokenizer"]) {
    r.tokenizer = yaml_.string(n["tokenizer"], p + ".tokenizer");
    if (r.tokenizer != "byte") r.tokenizer = yaml_.resolve(r.tokenizer).string();
  }
  if (n["out"]) r.out = yaml_.path(n["out"], p + ".out").string();
  if (n["steps"]) r.steps = yaml_.integer(n["steps"], p + ".steps");
  if (n["shared_memory"]) r.shared_memory = yaml_.boolean(n["shared_memory"], p + ".shared_memory");
  if (n["config_overrides"])
    r.config_overrides = yaml_.config_overrides(n["config_overrides"], p + ".config_overrides");
  if (n["comm_interface"])
    r.comm_interface = yaml_.string(n["comm_interface"], p + ".comm_interface");
  if (n["comm_address"]) r.comm_address = yaml_.string(n["comm_address"], p + ".comm_address");
}

// Names are what logs, exit messages and `offload:` lists refer to: they must be unique.
void DeployParser::check_names() {
  std::map<std::string, size_t> by_name;
  for (const auto& r : cfg_.roles) {
    const auto [it, fresh] = by_name.emplace(r.name, r.index);
    if (!fresh) {
      const YAML::Node& n = node_of(r);
      yaml_.fail(
          n["name"] ? n["name"] : n, fmt::format("roles[{}].name", r.index),
          fmt::format("duplicate name \"{}\" (also roles[{}]); every role needs its own name",
                      r.name, it->second));
    }
  }
  if (cfg_.of_kind(RoleKind::kCoordinator).size() > 1) {
    const auto* second = cfg_.of_kind(RoleKind::kCoordinator)[1];
    yaml_.fail(node_of(*second), fmt::format("roles[{}].role", second->index),
               "a deployment has at most one coordinator");
  }
}

// Explicit `listen` endpoints: validated, loopback unless allowed, one role each.
void DeployParser::bind_explicit_endpoints() {
  for (auto& r : cfg_.roles) {
    if (r.listen.empty()) continue;
    const YAML::Node n = node_of(r)["listen"];
    const std::string p = fmt::format("roles[{}].listen", r.index);
    std::string why;
    auto e = split_endpoint(r.listen, why);
    if (!e) yaml_.fail(n, p, fmt::format("value \"{}\" is not allowed: {}", r.listen, why));
    // ZeroMQ resolves a relative ipc path against the binding process's cwd; anchor it at
    // the deploy file like every other path.
    if (!e->tcp) e->text = "ipc://" + yaml_.resolve(e->text.substr(6)).string();
    if (e->tcp && !cfg_.allow_remote && !is_loopback_endpoint(e->text))
      yaml_.fail(n, p,
                 fmt::format("value \"{}\" listens beyond this machine (host \"{}\"); only "
                             "loopback (127.0.0.1, ::1) is allowed unless the top level sets "
                             "allow_remote: true (and the roles have keys: docs/security.md)",
                             r.listen, e->host));
    r.listen = e->text;
    if (e->tcp) used_ports_.insert(e->port);
    const auto [it, fresh] = by_endpoint_.emplace(r.listen, r.index);
    if (!fresh)
      yaml_.fail(n, p,
                 fmt::format("duplicate endpoint \"{}\" (also roles[{}] \"{}\"); each service "
                             "needs its own",
                             r.listen, it->second, cfg_.roles[it->second].name));
  }
}

// An explicit rendezvous endpoint: validated like a listen address, and its port kept out
// of the defaults. Whether something here binds it is decided once ranks are known.
void DeployParser::read_rendezvous_key() {
  const YAML::Node n = root()["rendezvous"];
  if (!n) return;
  const std::string text = yaml_.string(n, "rendezvous");
  if (!cfg_.of_kind(RoleKind::kCoordinator).empty())
    yaml_.fail(n, "rendezvous",
               fmt::format("value \"{}\" is not allowed with a coordinator role: the "
                           "coordinator's listen is the rendezvous; remove one of them",
                           text));
  std::string why;
  rendezvous_key_ = split_endpoint(text, why);
  if (!rendezvous_key_)
    yaml_.fail(n, "rendezvous", fmt::format("value \"{}\" is not allowed: {}", text, why));
  if (!rendezvous_key_->tcp)
    rendezvous_key_->text = "ipc://" + yaml_.resolve(rendezvous_key_->text.substr(6)).string();
  if (const auto it = by_endpoint_.find(rendezvous_key_->text); it != by_endpoint_.end())
    yaml_.fail(n, "rendezvous",
               fmt::format("endpoint \"{}\" is also roles[{}] \"{}\"'s listen; the rendezvous "
                           "needs its own",
                           rendezvous_key_->text, it->second, cfg_.roles[it->second].name));
  if (rendezvous_key_->tcp) used_ports_.insert(rendezvous_key_->port);
}

// Services without `listen` take the first free ports from kFirstDefaultPort, in file order.
void DeployParser::assign_default_ports() {
  for (auto& r : cfg_.roles) {
    if (r.kind == RoleKind::kTrainer || !r.listen.empty()) continue;
    while (used_ports_.count(next_port_)) ++next_port_;
    used_ports_.insert(next_port_);
    r.listen = fmt::format("tcp://127.0.0.1:{}", next_port_);
  }
}

// Loading never creates anything; `dsactor up` does, when create_dirs allows it.
void DeployParser::check_nvme_dirs() {
  for (const auto& r : cfg_.roles) {
    if (!r.nvme || cfg_.create_dirs) continue;
    const YAML::Node n = node_of(r)["nvme"];
    const std::string p = fmt::format("roles[{}].nvme", r.index);
    std::error_code ec;
    if (!fs::exists(*r.nvme, ec))
      yaml_.fail(n, p,
                 fmt::format("directory {} does not exist and create_dirs is false; create it or "
                             "set create_dirs: true (relative paths are resolved against {})",
                             r.nvme->string(), yaml_.base_dir().string()));
    if (!fs::is_directory(*r.nvme, ec))
      yaml_.fail(n, p, fmt::format("{} exists but is not a directory", r.nvme->string()));
  }
}

// Which services each trainer's partitions go to: its `offload` list, else every one.
void DeployParser::resolve_offload_lists() {
  std::vector<std::string> offload_names;
  for (const auto* o : cfg_.of_kind(RoleKind::kOffload)) offload_names.push_back(o->name);
  for (auto* t : trainers()) {
    const YAML::Node n = node_of(*t)["offload"];
    t->offload = n ? offload_list(n, fmt::format("roles[{}].offload", t->index), offload_names)
                   : offload_names;
  }
}

std::vector<std::string> DeployParser::offload_list(const YAML::Node& n, const std::string& p,
                                                    const std::vector<std::string>& offload_names) {
  std::vector<YAML::Node> items;
  if (n.IsScalar()) {
    items.push_back(n);
  } else if (n.IsSequence() && n.size() > 0) {
    for (const auto& e : n) items.push_back(e);
  } else {
    yaml_.fail(n, p,
               fmt::format("expected an offload role's name or a list of them, got {}",
                           DeployYaml::shown(n)));
  }
  std::vector<std::string> out;
  for (const auto& e : items) {
    const std::string name = yaml_.string(e, p);
    const RoleSpec* target = cfg_.find(name);
    if (!target)
      yaml_.fail(
          e, p,
          fmt::format("unknown offload service \"{}\"{}; offload roles here: {}", name,
                      key_table::did_you_mean(name, offload_names), names_or_none(offload_names)));
    if (target->kind != RoleKind::kOffload)
      yaml_.fail(e, p,
                 fmt::format("\"{}\" is a {} role, not an offload service; offload roles here: {}",
                             name, role_kind_name(target->kind), names_or_none(offload_names)));
    if (std::find(out.begin(), out.end(), name) != out.end())
      yaml_.fail(e, p, fmt::format("\"{}\" is listed twice", name));
    out.push_back(name);
  }
  return out;
}

// Explicit world sizes must agree (other machines may run the other ranks); unnumbered
// trainers take the lowest free ranks in file order.
void DeployParser::assign_ranks() {
  const auto ts = trainers();
  std::optional<int> world;
  for (auto* t : ts) {
    const YAML::Node n = node_of(*t)["world_size"];
    if (!n) continue;
    const std::string p = fmt::format("roles[{}].world_size", t->index);
    const int w = static_cast<int>(yaml_.integer(n, p));
    if (world && *world != w)
      yaml_.fail(n, p,
                 fmt::format("value {} differs from world_size {} given earlier; all trainers of "
                             "a job share one world size",
                             w, *world));
    world = w;
  }
  world_size_ = world.value_or(static_cast<int>(ts.size()));
  if (!ts.empty() && world_size_ < static_cast<int>(ts.size()))
    yaml_.fail(node_of(*ts.front())["world_size"],
               fmt::format("roles[{}].world_size", ts.front()->index),
               fmt::format("value {} is smaller than the {} trainers this file starts", world_size_,
                           ts.size()));
  for (auto* t : ts) {
    t->world_size = world_size_;
    const YAML::Node n = node_of(*t)["rank"];
    if (!n) continue;
    const std::string p = fmt::format("roles[{}].rank", t->index);
    t->rank = static_cast<int>(yaml_.integer(n, p, {.min = 0, .max = world_size_ - 1.0}));
    const auto [it, fresh] = by_rank_.emplace(t->rank, t->index);
    if (!fresh)
      yaml_.fail(n, p, fmt::format("duplicate rank {} (also roles[{}])", t->rank, it->second));
  }
  int next_rank = 0;
  for (auto* t : ts) {
    if (node_of(*t)["rank"]) continue;
    while (by_rank_.count(next_rank)) ++next_rank;
    t->rank = next_rank;
    by_rank_.emplace(next_rank, t->index);
  }
}

// The coordinator, else the explicit key, else an implicit loopback endpoint that trainer
// rank 0 binds. Loopback only works when every rank runs from this file.
void DeployParser::choose_rendezvous() {
  const auto ts = trainers();
  const bool rank0_here = by_rank_.count(0) > 0;
  if (const auto coordinators = cfg_.of_kind(RoleKind::kCoordinator); !coordinators.empty()) {
    cfg_.rendezvous = coordinators.front()->listen;
  } else if (rendezvous_key_) {
    cfg_.rendezvous = rendezvous_key_->text;
    cfg_.rendezvous_in_rank0 = rank0_here;
    if (rank0_here && rendezvous_key_->tcp && !cfg_.allow_remote &&
        !is_loopback_endpoint(cfg_.rendezvous))
      yaml_.fail(root()["rendezvous"], "rendezvous",
                 fmt::format("value \"{}\" makes trainer rank 0 listen beyond this machine, "
                             "which needs allow_remote: true",
                             cfg_.rendezvous));
  } else if (world_size_ > 1 && !ts.empty()) {
    if (!rank0_here || static_cast<int>(ts.size()) < world_size_)
      yaml_.fail(node_of(*ts.front()), fmt::format("roles[{}]", ts.front()->index),
                 fmt::format("world_size {} but this file runs {} trainer(s){}: trainers on other "
                             "machines cannot reach an implicit loopback rendezvous; add a "
                             "coordinator role they can reach, or set the top-level rendezvous: "
                             "tcp://HOST:PORT",
                             world_size_, ts.size(), rank0_here ? "" : " and not rank 0"));
    while (used_ports_.count(next_port_)) ++next_port_;
    cfg_.rendezvous = fmt::format("tcp://127.0.0.1:{}", next_port_);
    cfg_.rendezvous_in_rank0 = true;
  }
}

// What spans the security block and the roles: key files resolved when the file says
// where they are, and a rendezvous outside this file needs its server's key.
void DeployParser::check_security() {
  if (cfg_.security.insecure) return;
  if (!cfg_.security.keys_dir.empty()) resolve_key_files(cfg_, cfg_.security.keys_dir);
  const bool external_store = !cfg_.rendezvous.empty() && !cfg_.rendezvous_in_rank0 &&
                              cfg_.of_kind(RoleKind::kCoordinator).empty();
  if (external_store && cfg_.security.coordinator_key.empty() && !trainers().empty())
    yaml_.fail(root()["rendezvous"], "rendezvous",
               fmt::format("the store at \"{}\" runs outside this file: set "
                           "security.coordinator_key to its public key file (or "
                           "security.insecure: true on loopback)",
                           cfg_.rendezvous));
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

bool DeployConfig::is_server(const RoleSpec& r) const {
  return r.kind != RoleKind::kTrainer || (rendezvous_in_rank0 && r.rank == 0);
}

std::vector<const RoleSpec*> DeployConfig::clients_of(const RoleSpec& server) const {
  std::vector<const RoleSpec*> out;
  for (const auto* t : of_kind(RoleKind::kTrainer)) {
    const bool uses =
        server.kind == RoleKind::kOffload
            ? std::find(t->offload.begin(), t->offload.end(), server.name) != t->offload.end()
            : !rendezvous.empty();
    if (uses) out.push_back(t);
  }
  return out;
}

fs::path DeployConfig::rendezvous_key() const {
  if (rendezvous.empty()) return {};
  for (const auto& r : roles)
    if (r.kind != RoleKind::kOffload && is_server(r)) return r.public_key;
  return security.coordinator_key;
}

void resolve_key_files(DeployConfig& config, const fs::path& keys_dir) {
  config.security.keys_dir = keys_dir;
  for (auto& r : config.roles) {
    if (r.secret_key.empty()) r.secret_key = keys_dir / (r.name + ".key_secret");
    if (r.public_key.empty()) {
      const std::string secret = r.secret_key.string();
      r.public_key = secret.ends_with(".key_secret") ? fs::path(secret.substr(0, secret.size() - 7))
                                                     : keys_dir / (r.name + ".key");
    }
    if (r.authorized_keys.empty() && config.is_server(r))
      r.authorized_keys = keys_dir / (r.name + ".authorized");
  }
}

DeployConfig parse_deploy_config(const std::string& yaml_text, const fs::path& source) {
  return DeployParser(yaml_text, source).run();
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

}  // namespace dsactor::deploy
