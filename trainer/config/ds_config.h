#pragma once
// DeepSpeed configuration (ds_config.json / .yaml) as dsactor reads it.
//
// Every key lives in ONE table (ds_config_keys.cpp, ds_keys()) that drives parsing, type and
// range checks, the "did you mean" hint and docs/ds_config.md. Key names, defaults and
// derived rules follow DeepSpeed (deepspeed/runtime/config.py, zero/config.py,
// zero/offload_config.py, precision_config.py, lr_schedules.py). The parser only parses
// and validates: whether the trainer can run a stage or offload mode is decided at start-up.
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsactor::trainer {

// A config the user has to fix: the message names the file, the key path, the offending
// value and what is allowed.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class OptimizerType { kAdam, kAdamW, kLamb };
enum class SchedulerType {
  kNone,
  kWarmupLR,
  kWarmupDecayLR,
  kWarmupCosineLR,
  kOneCycle,
  kLRRangeTest
};
enum class WarmupType { kLog, kLinear };
enum class OffloadDevice { kNone, kCpu, kNvme };
// When an offload service answers a commit: once the step is decided and durable, its
// update published block by block behind the reply (kBehindReply), or once every block is
// updated (kBeforeReply); kByHost picks per service by where it runs against the trainer.
enum class UpdatePublication { kByHost, kBehindReply, kBeforeReply };
// "none" in DeepSpeed = not set (the engine picks the default for the precision in use).
enum class DataType { kNone, kFp16, kBf16, kFp32 };
enum class TagValidation { kWarn, kIgnore, kFail };

struct OptimizerConfig {
  // False when the file has no "optimizer" section (DeepSpeed then expects a client
  // optimizer; dsactor's trainer decides what that means).
  bool present = false;
  OptimizerType type = OptimizerType::kAdam;
  double lr = 0;
  std::array<double, 2> betas{};
  double eps = 0;
  double weight_decay = 0;
  // Effective value: true for type AdamW whatever the file says (DeepSpeed's rule).
  bool adam_w_mode = true;
  bool bias_correction = true;
  bool torch_adam = false;  // parsed only; dsactor always uses its own kernels
  // Lamb (DeepSpeed's FusedLamb): bounds of the trust ratio ||w|| / ||update||, and eps
  // added inside the square root instead of after it.
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  bool eps_inside_sqrt = false;
};

struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;
  double warmup_min_lr = 0;
  // Unset: WarmupLR uses the optimizer's lr, WarmupDecayLR uses 0.001 (DeepSpeed's
  // constructor defaults).
  std::optional<double> warmup_max_lr;
  int64_t warmup_num_steps = 0;
  WarmupType warmup_type = WarmupType::kLog;
  int64_t total_num_steps = 0;  // required for WarmupDecayLR and WarmupCosineLR
  double warmup_min_ratio = 0;
  double cos_min_ratio = 0;
  // Where DeepSpeed constructs the scheduler; -1 (the default) starts the schedule, and
  // only then does construction set the first step's lr (otherwise it is the optimizer's).
  int64_t last_batch_iteration = -1;
  // OneCycle (deepspeed/runtime/lr_schedules.py); cycle_min_lr and cycle_max_lr are required.
  double cycle_min_lr = 0;
  double cycle_max_lr = 0;
  double decay_lr_rate = 0;
  int64_t cycle_first_step_size = 0;
  std::optional<int64_t> cycle_second_step_size;  // unset: cycle_first_step_size
  int64_t cycle_first_stair_count = 0;
  std::optional<int64_t> cycle_second_stair_count;  // unset: cycle_first_stair_count
  int64_t decay_step_size = 0;
  // Cycles the optimizer's beta1 inversely to the lr, and sets beta2 to 0.99, as DeepSpeed's
  // OneCycle does with an optimizer that has betas.
  bool cycle_momentum = true;
  double cycle_min_mom = 0;
  double cycle_max_mom = 0;
  double decay_mom_rate = 0;
  // LRRangeTest.
  double lr_range_test_min_lr = 0;
  int64_t lr_range_test_step_size = 0;
  double lr_range_test_step_rate = 0;
  bool lr_range_test_staircase = false;
};

struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0;  // 0 = dynamic loss scaling
  int64_t initial_scale_power = 0;
  int64_t loss_scale_window = 0;
  int64_t hysteresis = 0;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 0;
  bool fp16_master_weights_and_grads = false;
  bool dynamic() const { return enabled && loss_scale == 0; }
};

struct Bf16Config {
  bool enabled = false;
  bool immediate_grad_update = false;
  bool check_grad_overflow = false;
  bool bf16_master_weights_and_grads = false;
  bool bf16_optimizer_states = false;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  int64_t buffer_count = 0;
  int64_t buffer_size = 0;
  int64_t max_in_cpu = 0;
  bool pin_memory = false;
  bool enabled() const { return device != OffloadDevice::kNone; }
};

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  int64_t buffer_count = 0;
  bool pin_memory = false;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;
  // dsactor's own key: ZeRO-Offload's one-step delayed parameter update (not bit-exact).
  bool delayed_parameter_update = false;
  // dsactor's own key: when the services answer a commit (see UpdatePublication).
  UpdatePublication update_publication = UpdatePublication::kByHost;
  // dsactor's own key: arena payloads carry a crc32c their receiver checks.
  bool arena_checksums = false;
  // dsactor's own key: each partition's Adam step runs on its push, in the backward
  // (PyTorch's optimizer-in-backward), instead of at the commit.
  bool update_at_push = false;
  bool enabled() const { return device != OffloadDevice::kNone; }
};

struct ZeroppLocoConfig {
  bool present = false;
  double err_beta = 0;
  int64_t reset_t = 0;
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 0;
  bool use_multi_rank_bucket_allreduce = true;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 0;
  // Effective value: when the file leaves it out, true exactly for stage 3 (DeepSpeed).
  bool overlap_comm = false;
  bool load_from_fp32_weights = true;
  bool elastic_checkpoint = false;
  OffloadParamConfig offload_param;
  OffloadOptimizerConfig offload_optimizer;
  int64_t sub_group_size = 0;
  int64_t prefetch_bucket_size = 0;
  int64_t param_persistence_threshold = 0;
  int64_t model_persistence_threshold = 0;
  int64_t max_live_parameters = 0;
  int64_t max_reuse_distance = 0;
  bool gather_16bit_weights_on_model_save = false;
  int64_t module_granularity_threshold = 0;
  bool use_all_reduce_for_fetch_params = false;
  bool ignore_unused_parameters = true;
  bool legacy_stage1 = false;
  bool round_robin_gradients = false;
  int64_t zero_hpz_partition_size = 1;
  bool zero_quantized_weights = false;
  bool zero_quantized_nontrainable_weights = false;
  bool zero_quantized_gradients = false;
  ZeroppLocoConfig zeropp_loco_param;
  int64_t mics_shard_size = -1;
  bool mics_hierarchical_params_gather = false;
  bool memory_efficient_linear = true;
  bool pipeline_loading_checkpoint = false;
  bool override_module_apply = true;
  bool log_trace_cache_warnings = false;
};

// DeepSpeed's `aio` block (deepspeed/runtime/swap_tensor/aio_config.py). dsactor applies
// it to the NVMe tier of the offload services `dsactor up` starts for this config.
struct AioConfig {
  int64_t block_size = 0;
  int64_t queue_depth = 0;
  int64_t intra_op_parallelism = 0;  // also spelled thread_count (deprecated)
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;  // only false: GPUDirect Storage is not supported
};

struct MonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name;
};

struct WandbConfig {
  bool enabled = false;
  std::optional<std::string> group;
  std::optional<std::string> team;
  std::string project;
};

struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;
  bool prof_all = true;
  bool debug = false;
  std::vector<std::string> prof_ops;
};

struct FlopsProfilerConfig {
  bool enabled = false;
  double recompute_fwd_factor = 0;
  int64_t profile_step = 0;
  int64_t module_depth = 0;
  int64_t top_modules = 0;
  bool detailed = true;
  std::optional<std::string> output_file;
};

// Parsed and documented; dsactor does not act on these keys yet.
struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

struct CheckpointConfig {
  TagValidation tag_validation = TagValidation::kWarn;
  bool load_universal = false;
  bool use_node_local_storage = false;
  bool parallel_write_pipeline_stage = false;
};

// Member initializers are placeholders: DeepSpeed's defaults live in the key table and are
// applied by parse_ds_config, so build a DsConfig by parsing, never by default construction.
struct DsConfig {
  std::string source;  // the file (or label) this was parsed from, for later messages
  int world_size = 1;
  // Always all three set and consistent: train_batch_size == micro * gas * world_size.
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;

  double gradient_clipping = 0;  // 0 = off
  // With the deprecated "zero_optimization": true form: its allgather_bucket_size.
  int64_t allgather_size = 0;
  int64_t steps_per_print = 0;
  bool wall_clock_breakdown = false;
  bool memory_breakdown = false;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  bool dump_state = false;
  bool sparse_gradients = false;
  bool dataloader_drop_last = false;
  bool zero_allow_untested_optimizer = false;
  bool zero_force_ds_cpu_optimizer = true;
  DataType communication_data_type = DataType::kNone;
  DataType grad_accum_dtype = DataType::kNone;  // data_types.grad_accum_dtype

  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero_optimization;
  AioConfig aio;
  MonitorConfig csv_monitor;
  MonitorConfig tensorboard;
  WandbConfig wandb;
  CommsLoggerConfig comms_logger;
  FlopsProfilerConfig flops_profiler;
  ActivationCheckpointingConfig activation_checkpointing;
  CheckpointConfig checkpoint;

  // Deprecated keys that were accepted and mapped (DeepSpeed warns about them too).
  std::vector<std::string> warnings;
  // Keys given with a value dsactor does not act on ("<path>: accepted, has no effect in
  // dsactor: <why>"), and unsupported sections given with enabled: false.
  std::vector<std::string> no_effect;
};

// `--set key.path=value` from the command line (or a deploy file's config_overrides): each
// sets or replaces one key of the file's tree before it is parsed. The value is read as
// JSON when it is valid JSON, else as a string ("1e-4" and "8" are numbers, "AdamW" a
// string, "[0.9, 0.95]" a list).
struct ConfigOverride {
  std::string path;  // dotted: "optimizer.params.lr"
  std::string value;
};
// "key.path=value" -> ConfigOverride; throws ConfigError naming the text when there is no
// '=' or the path is empty.
ConfigOverride parse_config_override(const std::string& text);
std::vector<ConfigOverride> parse_config_overrides(const std::vector<std::string>& texts);
// Applies the overrides to `j` in order (objects on the way are created); throws
// ConfigError when a path runs through a value that is not an object.
void apply_config_overrides(nlohmann::json& j, const std::vector<ConfigOverride>& overrides);

// Reads .json, or .yaml/.yml (converted to the same JSON tree; YAML 1.2 core scalars, so
// 2e8 is a number and quoted scalars stay strings). Logs the warnings with spdlog.
// `overrides` are applied to the file's tree first (apply_config_overrides); messages then
// name "<file> with --set" as the source.
DsConfig load_ds_config(const std::filesystem::path& file, int world_size = 1,
                        const std::vector<ConfigOverride>& overrides = {});

// `source` names the origin in error messages (normally the file path).
DsConfig parse_ds_config(const nlohmann::json& j, const std::string& source, int world_size = 1);

// The YAML -> JSON conversion load_ds_config uses (exposed for tests and deploy files).
nlohmann::json yaml_text_to_json(const std::string& yaml_text, const std::string& source);

// docs/ds_config.md, generated from the key table.
std::string ds_config_reference_markdown();

// For messages and logs: "Adam", "WarmupCosineLR", "cpu", ...
const char* to_string(OptimizerType t);
const char* to_string(SchedulerType t);
const char* to_string(OffloadDevice d);

}  // namespace dsactor::trainer
