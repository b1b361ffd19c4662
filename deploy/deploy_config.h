#pragma once
// The deployment file (deploy.yaml): which roles run, where they listen, where their state
// lives, and the ds_config each trainer uses. `dsactor up deploy.yaml` starts every role it
// names on this machine; `dsactor start --role ...` runs one of them by hand, with the
// command line to_command_line() gives.
//
// Every key lives in ONE table (deploy_keys.cpp, on the key_table/ engine) that drives the
// checks of every value, the "which role may use this key" check, the "did you mean" hint
// and deploy_reference_markdown().
// Relative paths in the file are resolved against the file's own directory, so a deployment
// means the same thing whatever directory `dsactor up` runs in.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsactor::deploy {

// A deployment the user has to fix: the message names the file (and line), the key path
// ("roles[1].listen"), the offending value and what is allowed.
class DeployConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class RoleKind { kOffload, kTrainer, kCoordinator };
std::string_view role_kind_name(RoleKind k);

// Storage-engine overrides of an offload service (the ds_config `aio` block's names);
// unset: the service's own (storage::NvmeOptions).
struct AioOverrides {
  std::optional<uint64_t> block_size;   // bytes, multiple of 4096
  std::optional<unsigned> queue_depth;  // io_uring requests in flight
  std::optional<bool> single_submit;    // one request per kernel entry
  std::optional<bool> overlap_events;   // refill the queue as requests complete
};

// A role's time to answer on its endpoint, and from SIGTERM to SIGKILL, unless the file
// says otherwise; the Supervisor's children (launch's ranks too) default to the same.
inline constexpr double kDefaultStartupSeconds = 60;
inline constexpr double kDefaultShutdownSeconds = 10;

// What `dsactor up` does when a role fails (exits non-zero, dies of a signal, or, a service,
// ends at all). Never by default: a restart hides a crash and redoes the work since the last
// checkpoint, so a deployment opts in, knowing where its checkpoints are.
enum class RestartMode { kNever, kOnFailure };
std::string_view restart_mode_name(RestartMode m);
inline constexpr int kDefaultMaxRestarts = 3;
inline constexpr double kDefaultRestartBackoffSeconds = 1;
inline constexpr double kDefaultRestartBackoffMaxSeconds = 30;

struct RoleSpec {
  RoleKind kind = RoleKind::kTrainer;
  // Unique in the deployment; the log prefix "[name]". Default: <role><n>, n counting roles
  // of the same kind in file order ("offload0", "trainer1").
  std::string name;
  size_t index = 0;  // position in `roles:` (the supervisor's exit code is 100 + index)

  // offload, coordinator: the ZeroMQ endpoint bound. Default tcp://127.0.0.1:<port>, ports
  // from 5555 up in file order, skipping ports named explicitly. "localhost" is written as
  // 127.0.0.1 so that duplicates and readiness compare one spelling.
  std::string listen;

  // offload; an unset value is the service's own default (offload::StoreOptions), which
  // the reference page shows
  std::optional<std::filesystem::path> nvme;  // NVMe tier directory (absolute)
  std::optional<uint64_t> memory_limit;       // `--memory-limit`; 0 = physical memory
  AioOverrides aio;
  std::optional<unsigned> buffer_count;  // `--buffer-count`: NVMe staging buffers
  std::optional<bool> mlock;             // false: `--no-mlock`
  std::optional<uint64_t> max_arena;     // `--max-arena`

  // trainer
  std::filesystem::path config;  // ds_config (absolute; must exist)
  std::string model;             // preset name, or a model YAML (absolute when it is a path)
  std::string data;              // absolute path, or empty
  std::string tokenizer;         // "byte", or a tokenizer path (absolute), or empty
  int64_t steps = 0;             // 0 = not set (the trainer's own default)
  std::string out;               // absolute path, or empty
  int rank = 0;
  int world_size = 1;
  std::vector<std::string> offload;   // names of offload roles; default: every offload role here
  std::optional<bool> shared_memory;  // false: `--no-shared-memory`; unset: the trainer's default
  // ds_config keys given here instead of in the file (`--set key.path=value` each, in file
  // order): "auto" values filled for this deployment, say. The value is JSON text.
  std::vector<std::pair<std::string, std::string>> config_overrides;
  std::string comm_interface;  // `--comm-interface`; empty: the trainer's default
  std::string comm_address;    // `--comm-address`; empty: the trainer's default
  // Every parameter partition and its optimizer state live on the offload services (ZeRO
  // with offload_optimizer), so a restarted trainer can continue from their committed step
  // without a checkpoint. Set by `dsactor up` from the ds_config (deploy/ reads no
  // ds_config; check_restart_sources runs then); false until then.
  bool state_on_services = false;

  // every role's key files (docs/security.md). Empty: not resolved yet (security.keys_dir
  // unset until `dsactor up` makes the run's directory). secret_key: its keypair, default
  // <keys_dir>/<name>.key_secret; public_key (servers): what clients are given, default the
  // secret's `.key` twin; authorized_keys (servers): the clients it admits, default
  // <keys_dir>/<name>.authorized, which `up` writes from the keys of the roles that use it.
  std::filesystem::path secret_key, public_key, authorized_keys;
  bool own_key_files = false;  // the file names secret_key itself: `up` never generates it

  // every role: `--metrics-listen HOST:PORT` (port 0: a free one, logged by the role;
  // off loopback only with allow_remote, and `up` then gives every role a metrics token);
  // empty: none of its own, or one `up` picks on loopback for the dashboard
  std::string metrics_listen;

  // every role; the timeouts' defaults are the deployment's (docs/deploy.md reads them here)
  std::vector<std::pair<std::string, std::string>> env;  // top-level env, then the role's own
  double startup_timeout = kDefaultStartupSeconds;       // seconds until the role must answer
  double shutdown_timeout = kDefaultShutdownSeconds;     // seconds from SIGTERM to SIGKILL
  // every role; defaults are the top level's. The n-th restart waits
  // min(restart_backoff * 2^(n-1), restart_backoff_max) seconds.
  RestartMode restart = RestartMode::kNever;
  int max_restarts = kDefaultMaxRestarts;  // restarts after a failure of this role
  double restart_backoff = kDefaultRestartBackoffSeconds;
  double restart_backoff_max = kDefaultRestartBackoffMaxSeconds;
};

// The top-level `checkpoint:` block, passed to every trainer; unset: the trainer's default.
struct CheckpointSpec {
  std::optional<int64_t> every;              // `--checkpoint-every`
  std::optional<int64_t> keep_last;          // `--keep-last`
  std::optional<std::filesystem::path> dir;  // `--checkpoint-dir` (absolute)
};

// The `security:` block: how the roles authenticate (docs/security.md).
struct DeploySecurity {
  bool insecure = false;  // plain ZeroMQ, loopback only: every role gets --insecure
  // Where the roles' keypairs and the servers' allow-lists are (absolute). Empty in the
  // file: `dsactor up` makes a fresh 0700 directory per run and removes it at the end.
  std::filesystem::path keys_dir;
  // The run's rendezvous token (--job-token-file); empty: `dsactor up` makes one per run and
  // hands it to the roles in DSACTOR_JOB_TOKEN.
  std::filesystem::path job_token_file;
  // The public key of a rendezvous server that runs outside this file (`rendezvous:` with
  // rank 0 elsewhere).
  std::filesystem::path coordinator_key;
};

struct DeployConfig {
  std::filesystem::path source;  // the deploy file, absolute
  std::string job;               // default: the file's stem
  bool allow_remote = false;     // allow listening on non-loopback addresses
  bool create_dirs = true;       // `up` creates missing nvme/out directories
  std::vector<RoleSpec> roles;   // in file order
  CheckpointSpec checkpoint;     // every trainer's checkpoints
  // Where the trainers rendezvous (Gloo store, NCCL unique id): the coordinator role's
  // `listen`; else the top-level `rendezvous` key; else, with world_size > 1, an implicit
  // tcp://127.0.0.1:<port> on the first port of the 5555+ scheme no role uses (only when
  // every rank runs from this file). Empty: one trainer and no coordinator, no rendezvous.
  std::string rendezvous;
  // No coordinator role: trainer rank 0 binds `rendezvous` itself, in-process (torchrun's
  // rank 0 hosting the TCPStore), when this file runs rank 0.
  bool rendezvous_in_rank0 = false;
  DeploySecurity security;
  // Where `dsactor up` serves the deployment's dashboard (HOST:PORT; port 0: a free one,
  // printed); empty (`dashboard_listen: none` in the file): no dashboard, and the roles
  // serve metrics only where their own metrics_listen says.
  std::string dashboard_listen = "127.0.0.1:0";

  const RoleSpec* find(std::string_view name) const;
  std::vector<const RoleSpec*> of_kind(RoleKind k) const;
  // Whether `role` listens: an offload or coordinator role, or trainer rank 0 serving the
  // rendezvous (rendezvous_in_rank0).
  bool is_server(const RoleSpec& role) const;
  // The roles that connect to `server`: the trainers whose offload list names it, or (the
  // rendezvous) every trainer.
  std::vector<const RoleSpec*> clients_of(const RoleSpec& server) const;
  // The public key file of the rendezvous server the trainers use; empty when there is none.
  std::filesystem::path rendezvous_key() const;
};

// Where a restarted trainer resumes from: checkpoint.dir, else <out>/checkpoint; empty when
// the trainer has neither (then `restart: on-failure` needs its state on offload services:
// check_restart_sources).
std::filesystem::path checkpoint_dir_of(const DeployConfig& config, const RoleSpec& trainer);

// Refuses `restart: on-failure` for a trainer with no checkpoint directory whose state is not
// on offload services (state_on_services false): nothing durable would be left to resume it
// from. DeployConfigError "file: roles[i].restart: ...". `dsactor up` calls it once it has
// set state_on_services from each trainer's ds_config.
void check_restart_sources(const DeployConfig& config);

// The roles `dsactor up` restarts together with `role` when it fails (`role` included), in
// file order: a trainer's group is every trainer (they resume from one durable step, as
// torchelastic restarts its whole worker group) and the coordinator (its store holds the
// previous rendezvous), but no offload service: a resumed trainer continues from what the
// services hold (their committed step, dropping the gradients of the step a killed trainer
// left unfinished) or from a newer checkpoint; a service's group is itself plus every
// trainer and the coordinator when trainers use it (they lost their step in flight there;
// an NVMe-tier service comes back from disk, a RAM-tier one empty, and the trainers then
// restore the checkpoint); a coordinator's is itself.
std::vector<const RoleSpec*> restart_group(const DeployConfig& config, const RoleSpec& role);

// Reads and validates a deploy file. Throws DeployConfigError.
DeployConfig load_deploy_config(const std::filesystem::path& path);
// Same, from text; `source` names the file in messages and anchors relative paths.
DeployConfig parse_deploy_config(const std::string& yaml_text, const std::filesystem::path& source);

// The argv (after the dsactor binary itself) that runs `role` by hand:
//   offload:     start --role offload --listen E [--nvme DIR] [--memory-limit BYTES]
//                [--aio-block-size B] [--aio-queue-depth Q] [--aio-single-submit BOOL]
//                [--aio-overlap-events BOOL] [--buffer-count N] [--no-mlock] [--max-arena BYTES]
//                [--metrics-listen HOST:PORT] SERVER-KEYS
//   trainer:     start --role trainer --name N --deploy FILE --config DS --rank R --world-size W
//                --job JOB (the services name the rank's job JOB, or JOB-rank<R> when W > 1)
//                [--offload ENDPOINT]... [--model M] [--data D] [--tokenizer T] [--steps S] [--out
//                DIR] [--set KEY=VALUE]... [--checkpoint-every N] [--keep-last K]
//                [--checkpoint-dir DIR] [--metrics-listen HOST:PORT]
//                [--coordinator ENDPOINT [--serve-coordinator]] [--comm-interface I]
//                [--comm-address A] CLIENT-KEYS
//   coordinator: start --role coordinator --name N --deploy FILE --listen E
//                [--metrics-listen HOST:PORT] SERVER-KEYS [TOKEN]
// SERVER-KEYS: --secret-key S --authorized-keys A; CLIENT-KEYS: --secret-key S, then
// --offload-key K for each --offload, and with a rendezvous --coordinator-key K
// [--authorized-keys A when it serves it] [TOKEN]; TOKEN: --job-token-file F when the file
// names one (else `up` passes DSACTOR_JOB_TOKEN). With security.insecure: --insecure and no
// keys. Key flags whose file is not resolved yet (no keys_dir) are left out.
// Every path is absolute; `--offload` lists the endpoints of the services the trainer's
// partitions go to, in the order the deploy file names them. `--coordinator` is
// config.rendezvous when set; `--serve-coordinator` goes to rank 0 when
// config.rendezvous_in_rank0 (it binds the endpoint). The offload line has no --name
// because `start --role offload` takes none (the supervisor passes DSACTOR_ROLE_NAME in the
// environment to every role instead).
std::vector<std::string> to_command_line(const DeployConfig& config, const RoleSpec& role);

// Fills every role's key file left unset from `keys_dir` (absolute), which becomes
// config.security.keys_dir. The parser calls it when the file sets keys_dir; `dsactor up`
// with the run's own directory otherwise.
void resolve_key_files(DeployConfig& config, const std::filesystem::path& keys_dir);

// Whether a tcp:// endpoint's host is a loopback address (127.0.0.0/8, ::1, localhost).
bool is_loopback_endpoint(std::string_view endpoint);

// What `dsactor up` warns about (allow_remote: true; docs/security.md): one line per role
// that listens beyond this machine (a `listen`, or the rendezvous trainer rank 0 serves),
// naming it and its endpoint, or one line saying allow_remote is set but unused. Empty
// without allow_remote.
std::vector<std::string> remote_listener_warnings(const DeployConfig& config);

// The key reference (docs/deploy.md is generated from it).
std::string deploy_reference_markdown();

}  // namespace dsactor::deploy
