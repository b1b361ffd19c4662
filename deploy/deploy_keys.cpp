// The deployment file's key table: every key of deploy.yaml, one row each, in the order
// docs/deploy.md lists them. A default that is another component's (the offload
// service's StoreOptions, its io_uring options) is read from that component, so the page
// cannot drift from what an unset key means. The table is data and stays one piece.
#include "deploy/deploy_keys.h"

#include <fmt/format.h>

#include "deploy/deploy_endpoint.h"
#include "key_table/reference_markdown.h"
#include "offload_service/partition_store.h"

namespace dsactor::deploy {
namespace {

using key_table::bool_value;
using key_table::float_value;
using key_table::int_value;
using key_table::KeySpec;
using key_table::ValueType;

// KeySpec::applies_to, in the order of role_index() and of the table's applicability.
enum RoleMask : unsigned { kOffload = 1, kTrainer = 2, kCoordinator = 4 };

constexpr std::string_view kNameRule = "1-64 of [A-Za-z0-9_.-]";
constexpr double kMaxSeconds = 86400;

const std::vector<KeySpec>& deploy_keys() {
  static const DeployConfig deployment;
  static const RoleSpec role;
  static const offload::StoreOptions store;
  static const std::vector<KeySpec> table = {
      // ---- top level ----
      {.path = "job",
       .type = ValueType::kString,
       .doc = "job id the trainers register under on the offload services (`<job>-rank<r>` "
              "per rank when there are several) and meet under at the rendezvous",
       .default_doc = "the file's stem",
       .allowed_doc = kNameRule},
      {.path = "roles",
       .type = ValueType::kObjectList,
       .doc = "the processes of the deployment, in start order.",
       .default_doc = "required",
       .allowed_doc = "a non-empty list of maps",
       .section = "Each entry of `roles:`"},
      {.path = "allow_remote",
       .type = ValueType::kBool,
       .def = bool_value(deployment.allow_remote),
       .doc = "allow `listen` and `rendezvous` on non-loopback addresses; refused with "
              "`security.insecure` (a remote listener needs keys); `dsactor up` warns for each "
              "role listening beyond loopback"},
      {.path = "create_dirs",
       .type = ValueType::kBool,
       .def = bool_value(deployment.create_dirs),
       .doc = "`dsactor up` creates missing `nvme` and `out` directories; false: a missing one "
              "is an error"},
      {.path = "dashboard_listen",
       .type = ValueType::kString,
       .doc = "where `dsactor up` serves the deployment's dashboard (every role's figures, "
              "`dsactor status` reads it too); it prints the URL at start",
       .default_doc = "127.0.0.1:0 (a free port the file names for no other listener)",
       .allowed_doc = "HOST:PORT, or `none`; off loopback with `allow_remote` only (with a "
                      "token `up` prints)"},
      {.path = "env",
       .type = ValueType::kStringMap,
       .doc = "environment added to every role",
       .default_doc = "{}"},
      {.path = "rendezvous",
       .type = ValueType::kEndpoint,
       .doc = "where trainers rendezvous (`--coordinator`); without a coordinator role, trainer "
              "rank 0 binds it (`--serve-coordinator`). Needed when trainers on other machines "
              "take part and there is no coordinator role",
       .default_doc = fmt::format("the coordinator's `listen`; else, with world_size > 1, "
                                  "tcp://127.0.0.1:<first free {}+ port>",
                                  kFirstDefaultPort)},
      {.path = "startup_timeout",
       .type = ValueType::kSeconds,
       .def = float_value(role.startup_timeout),
       .min = 0,
       .max = kMaxSeconds,
       .min_exclusive = true,
       .doc = "default for every role: time a service has to answer on its endpoint"},
      {.path = "shutdown_timeout",
       .type = ValueType::kSeconds,
       .def = float_value(role.shutdown_timeout),
       .min = 0,
       .max = kMaxSeconds,
       .min_exclusive = true,
       .doc = "default for every role: time from SIGTERM to SIGKILL"},
      {.path = "restart",
       .type = ValueType::kEnum,
       .def = key_table::string_value(std::string(restart_mode_name(role.restart))),
       .choices = {"never", "on-failure"},
       .doc = "default for every role: what `dsactor up` does when the role fails (a non-zero "
              "exit, a signal, a service that ends). on-failure restarts it with the same "
              "arguments, keys and token, together with its restart group (docs/deploy.md, "
              "README \"When things fail\"); trainers resume from the newest checkpoint. never "
              "(the default: a restart redoes the work since the last checkpoint and hides the "
              "crash, so a deployment opts in) stops the deployment"},
      {.path = "max_restarts",
       .type = ValueType::kInt,
       .def = int_value(role.max_restarts),
       .min = 0,
       .max = 1000000,
       .doc = "default for every role: restarts after failures of the role; one more failure "
              "fails the deployment"},
      {.path = "restart_backoff",
       .type = ValueType::kSeconds,
       .def = float_value(role.restart_backoff),
       .min = 0,
       .max = kMaxSeconds,
       .doc = "default for every role: wait before the first restart; each further restart of "
              "the role waits twice as long, up to restart_backoff_max"},
      {.path = "restart_backoff_max",
       .type = ValueType::kSeconds,
       .def = float_value(role.restart_backoff_max),
       .min = 0,
       .max = kMaxSeconds,
       .doc = "default for every role: the longest wait before a restart"},
      {.path = "checkpoint",
       .type = ValueType::kObject,
       .doc = "the trainers' checkpoints, given to every trainer.",
       .allowed_doc = "a map",
       .section = "`checkpoint:`"},
      {.path = "checkpoint.every",
       .type = ValueType::kInt,
       .def = int_value(0),
       .min = 0,
       .doc = "a checkpoint every N global steps besides the end (`--checkpoint-every`); 0: at "
              "the end (and on a stop) only"},
      {.path = "checkpoint.keep_last",
       .type = ValueType::kInt,
       .def = int_value(0),
       .min = 0,
       .doc = "the newest K checkpoint tags stay, older ones are removed once a new one is "
              "complete (`--keep-last`); 0: every tag stays"},
      {.path = "checkpoint.dir",
       .type = ValueType::kPath,
       .doc = "where checkpoints go: `<dir>/global_step<N>/` and `<dir>/latest` "
              "(`--checkpoint-dir`); shared by the trainers of a data-parallel job",
       .default_doc = "each trainer's `<out>/checkpoint`"},
      // ---- each entry of roles: ----
      {.path = "roles[].role",
       .type = ValueType::kEnum,
       .choices = {"offload", "trainer", "coordinator"},
       .doc = "what the process runs",
       .default_doc = "required"},
      {.path = "roles[].name",
       .type = ValueType::kString,
       .doc = "unique name; the log prefix; what trainers' `offload` lists refer to",
       .default_doc = "<role><n>",
       .allowed_doc = kNameRule},
      {.path = "roles[].listen",
       .type = ValueType::kEndpoint,
       .doc = "ZeroMQ endpoint bound",
       .applies_to = kOffload | kCoordinator,
       .default_doc = fmt::format("tcp://127.0.0.1:<{}+>", kFirstDefaultPort)},
      {.path = "roles[].nvme",
       .type = ValueType::kPath,
       .doc = "directory of the NVMe tier",
       .applies_to = kOffload,
       .default_doc = "none (RAM tier only)"},
      {.path = "roles[].memory_limit",
       .type = ValueType::kBytes,
       .def = int_value(static_cast<int64_t>(store.memory_limit)),
       .doc = "bytes of RAM partitions may take; 0: the machine's physical memory",
       .applies_to = kOffload},
      {.path = "roles[].aio",
       .type = ValueType::kObject,
       .doc = "io_uring settings of the NVMe tier.",
       .applies_to = kOffload,
       .allowed_doc = "a map",
       .section = "`aio:` of an offload role"},
      {.path = "roles[].buffer_count",
       .type = ValueType::kInt,
       .def = int_value(store.buffer_count),
       .min = 3,
       .max = 1024,
       .doc = "NVMe staging buffers (one computed, the rest read ahead and written behind); "
              "`dsactor up` sets it from a trainer's ds_config offload buffer_count when the "
              "ds_config puts that trainer's state on NVMe",
       .applies_to = kOffload},
      {.path = "roles[].mlock",
       .type = ValueType::kBool,
       .def = bool_value(store.lock_memory),
       .doc = "pin RAM buffers (cudaHostAlloc, else mlock) where allowed",
       .applies_to = kOffload},
      {.path = "roles[].max_arena",
       .type = ValueType::kBytes,
       .def = int_value(static_cast<int64_t>(store.max_arena_bytes)),
       .doc = "shared-memory arenas of same-host trainers mapped at once; beyond it a trainer "
              "moves payloads as frames; 0: never map",
       .applies_to = kOffload},
      {.path = "roles[].config",
       .type = ValueType::kPath,
       .doc = "the trainer's ds_config (.json or .yaml)",
       .applies_to = kTrainer,
       .default_doc = "required"},
      {.path = "roles[].model",
       .type = ValueType::kString,
       .doc = "model preset or model YAML",
       .applies_to = kTrainer,
       .default_doc = "the trainer's default",
       .allowed_doc = "a preset name or a path"},
      {.path = "roles[].data",
       .type = ValueType::kPath,
       .doc = "training data",
       .applies_to = kTrainer,
       .default_doc = "the trainer's default"},
      {.path = "roles[].tokenizer",
       .type = ValueType::kString,
       .doc = "tokenizer of text data: a GPT-2 tokenizer directory, tokenizer.json or "
              "vocab.json; recorded in the checkpoint and weights",
       .applies_to = kTrainer,
       .default_doc = "byte",
       .allowed_doc = "byte or a path"},
      {.path = "roles[].steps",
       .type = ValueType::kInt,
       .min = 1,
       .doc = "optimizer steps",
       .applies_to = kTrainer,
       .default_doc = "the trainer's default"},
      {.path = "roles[].out",
       .type = ValueType::kPath,
       .doc = "output directory",
       .applies_to = kTrainer,
       .default_doc = "the trainer's default"},
      {.path = "roles[].rank",
       .type = ValueType::kInt,
       .min = 0,
       .doc = "data-parallel rank, below world_size",
       .applies_to = kTrainer,
       .default_doc = "trainers numbered in file order"},
      {.path = "roles[].world_size",
       .type = ValueType::kInt,
       .min = 1,
       .max = 1 << 20,
       .doc = "data-parallel world size (larger when other machines run more trainers)",
       .applies_to = kTrainer,
       .default_doc = "number of trainers in the file"},
      {.path = "roles[].shared_memory",
       .type = ValueType::kBool,
       .doc = "false: payloads to same-host offload services go as frames over the socket "
              "instead of through a shared-memory arena (lower peak memory, more CPU)",
       .applies_to = kTrainer,
       .default_doc = "the trainer's default"},
      {.path = "roles[].config_overrides",
       .type = ValueType::kStringMap,
       .doc = "ds_config keys set for this trainer (`--set key.path=value` each), e.g. "
              "filling the Hugging Face \"auto\" values: `{train_micro_batch_size_per_gpu: 4, "
              "optimizer.params.lr: 1e-4}`; a value is read as JSON when it is JSON, else as "
              "a string; a list becomes a JSON list",
       .applies_to = kTrainer,
       .default_doc = "{}",
       .allowed_doc = "a map key.path: value"},
      {.path = "roles[].comm_interface",
       .type = ValueType::kString,
       .doc = "network interface the trainers' collectives bind (Gloo's TCP transport, "
              "NCCL_SOCKET_IFNAME; not authenticated: docs/security.md)",
       .applies_to = kTrainer,
       .default_doc = "loopback with a loopback rendezvous, else the interface that routes to it",
       .allowed_doc = "an interface name (eth0, ib0)"},
      {.path = "roles[].comm_address",
       .type = ValueType::kString,
       .doc = "IPv4 address the trainers' collectives bind, instead of comm_interface",
       .applies_to = kTrainer,
       .default_doc = "see comm_interface",
       .allowed_doc = "an address of this machine"},
      {.path = "roles[].offload",
       .type = ValueType::kStringList,
       .doc = "offload services this trainer's partitions go to",
       .applies_to = kTrainer,
       .default_doc = "every offload role in the file",
       .allowed_doc = "an offload role's name or a list of them"},
      {.path = "roles[].metrics_listen",
       .type = ValueType::kString,
       .doc = "serve Prometheus `/metrics` and JSON `/api/state` over HTTP here "
              "(`--metrics-listen`); port 0 picks a free one, which the role logs",
       .applies_to = kOffload | kTrainer | kCoordinator,
       .default_doc = "with the dashboard, a free loopback port `dsactor up` picks (never one "
                      "the file names for another listener); else none",
       .allowed_doc = "HOST:PORT (127.0.0.1:9100); off loopback with `allow_remote` only, "
                      "and `dsactor up` then gives every role a metrics token it prints"},
      {.path = "roles[].env",
       .type = ValueType::kStringMap,
       .doc = "environment added to this role (overrides the top-level env)",
       .default_doc = "{}"},
      {.path = "roles[].startup_timeout",
       .type = ValueType::kSeconds,
       .min = 0,
       .max = kMaxSeconds,
       .min_exclusive = true,
       .doc = "see the top-level key",
       .default_doc = "top-level value"},
      {.path = "roles[].shutdown_timeout",
       .type = ValueType::kSeconds,
       .min = 0,
       .max = kMaxSeconds,
       .min_exclusive = true,
       .doc = "see the top-level key",
       .default_doc = "top-level value"},
      {.path = "roles[].restart",
       .type = ValueType::kEnum,
       .choices = {"never", "on-failure"},
       .doc = "see the top-level key",
       .default_doc = "top-level value"},
      {.path = "roles[].max_restarts",
       .type = ValueType::kInt,
       .min = 0,
       .max = 1000000,
       .doc = "see the top-level key",
       .default_doc = "top-level value"},
      {.path = "roles[].restart_backoff",
       .type = ValueType::kSeconds,
       .min = 0,
       .max = kMaxSeconds,
       .doc = "see the top-level key",
       .default_doc = "top-level value"},
      {.path = "roles[].restart_backoff_max",
       .type = ValueType::kSeconds,
       .min = 0,
       .max = kMaxSeconds,
       .doc = "see the top-level key",
       .default_doc = "top-level value"},
      {.path = "roles[].secret_key",
       .type = ValueType::kPath,
       .doc = "this role's keypair (`--secret-key`, a .key_secret file, mode 0600), for keys "
              "distributed by hand; `up` generates none for it",
       .default_doc = "<keys_dir>/<name>.key_secret"},
      {.path = "roles[].public_key",
       .type = ValueType::kPath,
       .doc = "this server's public key, given to its clients (`--offload-key`, "
              "`--coordinator-key`)",
       .default_doc = "the secret key's .key twin, else <keys_dir>/<name>.key"},
      {.path = "roles[].authorized_keys",
       .type = ValueType::kPath,
       .doc = "the client keys this server admits (`--authorized-keys`: a file of Z85 keys or a "
              "directory of .key files); trainers use it when rank 0 serves the rendezvous",
       .default_doc = "<keys_dir>/<name>.authorized, written by `up` from its clients' keys"},
      // ---- aio: of an offload role (unset: the service's storage::NvmeOptions) ----
      {.path = "roles[].aio.block_size",
       .type = ValueType::kBytes,
       .def = int_value(static_cast<int64_t>(store.nvme.block_size)),
       .doc = "io_uring request size",
       .applies_to = kOffload,
       .allowed_doc = "a byte count, a multiple of 4096 up to 1GiB"},
      {.path = "roles[].aio.queue_depth",
       .type = ValueType::kInt,
       .def = int_value(store.nvme.queue_depth),
       .min = 1,
       .max = 4096,
       .doc = "io_uring requests in flight",
       .applies_to = kOffload},
      {.path = "roles[].aio.single_submit",
       .type = ValueType::kBool,
       .def = bool_value(store.nvme.single_submit),
       .doc = "enter the kernel once per request instead of once per batch",
       .applies_to = kOffload},
      {.path = "roles[].aio.overlap_events",
       .type = ValueType::kBool,
       .def = bool_value(store.nvme.overlap_events),
       .doc = "refill the queue as requests complete (false: whole batches)",
       .applies_to = kOffload},
      // ---- security: (last on the page: every role's keys come from it) ----
      {.path = "security",
       .type = ValueType::kObject,
       .doc = "how the roles authenticate (CurveZMQ keys, the rendezvous token; "
              "docs/security.md).",
       .default_doc = "keys made per run",
       .allowed_doc = "a map",
       .section = "`security:`"},
      {.path = "security.insecure",
       .type = ValueType::kBool,
       .def = bool_value(deployment.security.insecure),
       .doc = "plain ZeroMQ without keys: every role gets `--insecure`, listens on loopback "
              "only and warns at start"},
      {.path = "security.keys_dir",
       .type = ValueType::kPath,
       .doc = "where each role's keypair (<name>.key, <name>.key_secret) and each server's "
              "allow-list (<name>.authorized) are; `up` generates the missing ones (0700 "
              "directory, 0600 secrets), `up --make-keys` only that",
       .default_doc = "a fresh directory per run, removed at the end"},
      {.path = "security.job_token_file",
       .type = ValueType::kPath,
       .doc = "the run's rendezvous token (`--job-token-file`, mode 0600); `up --make-keys` "
              "writes one when it is missing",
       .default_doc = "a fresh token per run, in DSACTOR_JOB_TOKEN"},
      {.path = "security.coordinator_key",
       .type = ValueType::kPath,
       .doc = "the public key of a rendezvous server outside this file (`rendezvous:` with "
              "rank 0 elsewhere)",
       .default_doc = "the coordinator role's or trainer rank 0's public_key"},
  };
  return table;
}

}  // namespace

const key_table::KeyTable& deploy_key_table() {
  static const key_table::KeyTable table = key_table::KeyTable::of(
      deploy_keys(), {"role", "roles", {"offload", "trainer", "coordinator"}});
  return table;
}

size_t role_index(RoleKind kind) {
  switch (kind) {
    case RoleKind::kOffload:
      return 0;
    case RoleKind::kTrainer:
      return 1;
    case RoleKind::kCoordinator:
      break;
  }
  return 2;
}

std::string deploy_reference_markdown() {
  return key_table::reference_markdown(
      deploy_key_table(),
      "# Deployment file (deploy.yaml)\n\n"
      "Generated from the key table in `deploy/deploy_keys.cpp` by "
      "`deploy_reference_markdown()`; `test_deploy_docs` fails when this file differs from it "
      "(`DSACTOR_UPDATE_DOCS=1 build/tests/test_deploy_docs` rewrites it).\n"
      "Relative paths are resolved against the deploy file's directory. A key of another "
      "role, an unknown key and a value that is not allowed are errors naming the file, the "
      "line, the key path (`roles[1].listen`) and what is allowed.\n");
}

}  // namespace dsactor::deploy
