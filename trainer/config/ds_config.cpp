#include "trainer/config/ds_config.h"
#include "key_table/key_suggestion.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <variant>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

namespace dsactor::trainer {
namespace {

using json = nlohmann::json;

// One parsed leaf value. Numbers are already converted to the key's type (int64 for
// integer keys, double for float keys); monostate is JSON null / "not given".
using Value = std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<double>,
                           std::vector<std::string>>;

enum class Kind { kBool, kInt, kFloat, kString, kEnum, kFloatPair, kStringList, kObject };

// Which scheduler types take a scheduler.params key (DeepSpeed passes params as constructor
// kwargs, so a key the type does not know is a TypeError there and an error here).
constexpr unsigned kWarmupLRMask = 1;
constexpr unsigned kWarmupDecayLRMask = 2;
constexpr unsigned kWarmupCosineLRMask = 4;

constexpr double kInf = std::numeric_limits<double>::infinity();

using Setter = void (*)(DsConfig&, const Value&);

struct KeySpec {
  std::string_view path;
  Kind kind;
  Value def = {};  // monostate: no default (required, or derived in post-processing)
  double min = -kInf;
  double max = kInf;
  bool min_exclusive = false;
  std::vector<std::string_view> choices = {};  // kEnum: canonical spellings
  bool icase = false;                          // kEnum: DeepSpeed lower/upper-cases the value
  // kEnum: values DeepSpeed accepts but dsactor does not implement (clearer error).
  std::vector<std::string_view> unsupported = {};
  std::string_view doc = {};
  Setter set = nullptr;
  std::string_view alias_of = {};     // canonical key path; this spelling is also accepted
  bool deprecated = false;            // accepted with a warning
  bool nullable = false;              // JSON null allowed
  unsigned only_for = 0;              // scheduler.params: mask of scheduler types
  std::string_view default_doc = {};  // default shown in the docs when def can't say it
};

Value B(bool b) {
  return Value(b);
}
Value I(int64_t i) {
  return Value(i);
}
Value F(double d) {
  return Value(d);
}
Value S(const char* s) {
  return Value(std::string(s));
}

// ---- assigning parsed values into DsConfig ----

void assign(bool& d, const Value& v) {
  d = std::get<bool>(v);
}
void assign(int64_t& d, const Value& v) {
  d = std::get<int64_t>(v);
}
void assign(int& d, const Value& v) {
  d = static_cast<int>(std::get<int64_t>(v));
}
void assign(double& d, const Value& v) {
  d = std::get<double>(v);
}
void assign(std::string& d, const Value& v) {
  d = std::holds_alternative<std::monostate>(v) ? std::string() : std::get<std::string>(v);
}
void assign(std::array<double, 2>& d, const Value& v) {
  const auto& p = std::get<std::vector<double>>(v);
  d = {p.at(0), p.at(1)};
}
void assign(std::vector<std::string>& d, const Value& v) {
  d = std::get<std::vector<std::string>>(v);
}
void assign(OptimizerType& d, const Value& v) {
  d = std::get<std::string>(v) == "AdamW" ? OptimizerType::kAdamW : OptimizerType::kAdam;
}
void assign(SchedulerType& d, const Value& v) {
  const auto& s = std::get<std::string>(v);
  d = s == "WarmupLR"         ? SchedulerType::kWarmupLR
      : s == "WarmupDecayLR"  ? SchedulerType::kWarmupDecayLR
      : s == "WarmupCosineLR" ? SchedulerType::kWarmupCosineLR
                              : SchedulerType::kNone;
}
void assign(WarmupType& d, const Value& v) {
  d = std::get<std::string>(v) == "linear" ? WarmupType::kLinear : WarmupType::kLog;
}
void assign(OffloadDevice& d, const Value& v) {
  const auto& s = std::get<std::string>(v);
  d = s == "cpu" ? OffloadDevice::kCpu : s == "nvme" ? OffloadDevice::kNvme : OffloadDevice::kNone;
}
void assign(DataType& d, const Value& v) {
  if (std::holds_alternative<std::monostate>(v)) {
    d = DataType::kNone;
    return;
  }
  const auto& s = std::get<std::string>(v);
  d = s == "fp16" ? DataType::kFp16 : s == "bf16" ? DataType::kBf16 : DataType::kFp32;
}
void assign(TagValidation& d, const Value& v) {
  const auto& s = std::get<std::string>(v);
  d = s == "Ignore" ? TagValidation::kIgnore
      : s == "Fail" ? TagValidation::kFail
                    : TagValidation::kWarn;
}
template <class T>
void assign(std::optional<T>& d, const Value& v) {
  if (std::holds_alternative<std::monostate>(v)) {
    d.reset();
    return;
  }
  T t{};
  assign(t, v);
  d = std::move(t);
}

#define DS_SET(member) [](DsConfig& c, const Value& v) { assign(c.member, v); }

// THE table: every key dsactor reads from a DeepSpeed config, in documentation order.
// Parents (kObject) come before their children.
const std::vector<KeySpec>& key_table() {
  static const std::vector<KeySpec> table = {
      // ---- batch ----
      {.path = "train_batch_size",
       .kind = Kind::kInt,
       .min = 1,
       .doc = "Samples per optimizer step over all ranks: micro batch * gradient accumulation "
              "steps * world_size.",
       .set = DS_SET(train_batch_size),
       .default_doc = "derived"},
      {.path = "train_micro_batch_size_per_gpu",
       .kind = Kind::kInt,
       .min = 1,
       .doc = "Samples per forward/backward on one rank.",
       .set = DS_SET(train_micro_batch_size_per_gpu),
       .default_doc = "derived"},
      {.path = "gradient_accumulation_steps",
       .kind = Kind::kInt,
       .min = 1,
       .doc = "Micro batches accumulated before each optimizer step.",
       .set = DS_SET(gradient_accumulation_steps),
       .default_doc = "derived"},
      // ---- training knobs ----
      {.path = "gradient_clipping",
       .kind = Kind::kFloat,
       .def = F(0.0),
       .min = 0,
       .doc = "Clip the global gradient L2 norm to this value; 0 turns clipping off.",
       .set = DS_SET(gradient_clipping)},
      {.path = "steps_per_print",
       .kind = Kind::kInt,
       .def = I(10),
       .min = 1,
       .doc = "Log progress every this many optimizer steps.",
       .set = DS_SET(steps_per_print)},
      {.path = "wall_clock_breakdown",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Time forward, backward and step separately and log the breakdown.",
       .set = DS_SET(wall_clock_breakdown)},
      {.path = "memory_breakdown",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Log memory use at the phases of a step.",
       .set = DS_SET(memory_breakdown)},
      {.path = "prescale_gradients",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Divide gradients by the data-parallel size before the reduction instead of after.",
       .set = DS_SET(prescale_gradients)},
      {.path = "gradient_predivide_factor",
       .kind = Kind::kFloat,
       .def = F(1.0),
       .min = 0,
       .min_exclusive = true,
       .doc = "Divide gradients by this factor before the reduction and by "
              "world_size/factor after it.",
       .set = DS_SET(gradient_predivide_factor)},
      {.path = "dump_state",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Print the engine state after initialization.",
       .set = DS_SET(dump_state)},
      {.path = "sparse_gradients",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "CSR gradients for embeddings (parsed only).",
       .set = DS_SET(sparse_gradients)},
      {.path = "dataloader_drop_last",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Drop the last incomplete batch of an epoch.",
       .set = DS_SET(dataloader_drop_last)},
      {.path = "zero_allow_untested_optimizer",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Allow ZeRO with an optimizer DeepSpeed has not tested (parsed only).",
       .set = DS_SET(zero_allow_untested_optimizer)},
      {.path = "zero_force_ds_cpu_optimizer",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Require DeepSpeed's CPU optimizer with optimizer offload (parsed only).",
       .set = DS_SET(zero_force_ds_cpu_optimizer)},
      {.path = "communication_data_type",
       .kind = Kind::kEnum,
       .choices = {"fp16", "bf16", "fp32"},
       .icase = true,
       .doc = "Data type of gradient reductions; null = the training precision.",
       .set = DS_SET(communication_data_type),
       .nullable = true},
      // ---- optimizer ----
      {.path = "optimizer",
       .kind = Kind::kObject,
       .doc = "The optimizer DeepSpeed builds from the config (FusedAdam semantics)."},
      {.path = "optimizer.type",
       .kind = Kind::kEnum,
       .choices = {"Adam", "AdamW"},
       .icase = true,
       .unsupported = {"Adagrad", "Lamb", "OneBitAdam", "OneBitLamb", "ZeroOneAdam", "Lion",
                       "MuAdam", "MuAdamW", "MuSGD", "Muon", "SGD"},
       .doc = "Optimizer name, case-insensitive. AdamW forces adam_w_mode on.",
       .set = DS_SET(optimizer.type),
       .default_doc = "required"},
      {.path = "optimizer.params",
       .kind = Kind::kObject,
       .doc = "Constructor arguments of the optimizer."},
      {.path = "optimizer.params.lr",
       .kind = Kind::kFloat,
       .def = F(1e-3),
       .min = 0,
       .doc = "Learning rate (the base lr a WarmupLR without warmup_max_lr and WarmupCosineLR "
              "scale).",
       .set = DS_SET(optimizer.lr)},
      {.path = "optimizer.params.betas",
       .kind = Kind::kFloatPair,
       .def = Value(std::vector<double>{0.9, 0.999}),
       .min = 0,
       .max = 1,
       .doc = "Adam's (beta1, beta2).",
       .set = DS_SET(optimizer.betas)},
      {.path = "optimizer.params.eps",
       .kind = Kind::kFloat,
       .def = F(1e-8),
       .min = 0,
       .doc = "Added to the denominator for numerical stability.",
       .set = DS_SET(optimizer.eps)},
      {.path = "optimizer.params.weight_decay",
       .kind = Kind::kFloat,
       .def = F(0.0),
       .min = 0,
       .doc = "Weight decay (decoupled when adam_w_mode, else L2 added to the gradient).",
       .set = DS_SET(optimizer.weight_decay)},
      {.path = "optimizer.params.adam_w_mode",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Decoupled weight decay (AdamW). Ignored (always true) for type AdamW.",
       .set = DS_SET(optimizer.adam_w_mode)},
      {.path = "optimizer.params.bias_correction",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Apply Adam's bias correction to the moments.",
       .set = DS_SET(optimizer.bias_correction)},
      {.path = "optimizer.params.torch_adam",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Use torch.optim.Adam in DeepSpeed (parsed only; dsactor has its own kernels).",
       .set = DS_SET(optimizer.torch_adam)},
      // ---- scheduler ----
      {.path = "scheduler",
       .kind = Kind::kObject,
       .doc = "Learning-rate schedule, stepped after every applied (not skipped) optimizer "
              "step; the first step uses the value before any step (warmup_min_lr, or 0 for "
              "WarmupCosineLR), as in DeepSpeed."},
      {.path = "scheduler.type",
       .kind = Kind::kEnum,
       .choices = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"},
       .unsupported = {"LRRangeTest", "OneCycle"},
       .doc = "Schedule name (case-sensitive, as in DeepSpeed).",
       .set = DS_SET(scheduler.type),
       .default_doc = "required"},
      {.path = "scheduler.params",
       .kind = Kind::kObject,
       .doc = "Constructor arguments of the schedule; each type takes only its own keys."},
      {.path = "scheduler.params.warmup_min_lr",
       .kind = Kind::kFloat,
       .def = F(0.0),
       .min = 0,
       .doc = "WarmupLR, WarmupDecayLR: lr at the start of warmup.",
       .set = DS_SET(scheduler.warmup_min_lr),
       .only_for = kWarmupLRMask | kWarmupDecayLRMask},
      {.path = "scheduler.params.warmup_max_lr",
       .kind = Kind::kFloat,
       .min = 0,
       .doc = "WarmupLR, WarmupDecayLR: lr at the end of warmup.",
       .set = DS_SET(scheduler.warmup_max_lr),
       .only_for = kWarmupLRMask | kWarmupDecayLRMask,
       .default_doc = "0.001 (WarmupLR: the optimizer lr)"},
      {.path = "scheduler.params.warmup_num_steps",
       .kind = Kind::kInt,
       .def = I(1000),
       .min = 1,
       .doc = "Warmup length in optimizer steps (DeepSpeed uses max(2, value)).",
       .set = DS_SET(scheduler.warmup_num_steps),
       .only_for = kWarmupLRMask | kWarmupDecayLRMask | kWarmupCosineLRMask},
      {.path = "scheduler.params.warmup_type",
       .kind = Kind::kEnum,
       .def = S("log"),
       .choices = {"log", "linear"},
       .doc = "Shape of the warmup ramp.",
       .set = DS_SET(scheduler.warmup_type),
       .only_for = kWarmupLRMask | kWarmupDecayLRMask | kWarmupCosineLRMask},
      {.path = "scheduler.params.total_num_steps",
       .kind = Kind::kInt,
       .min = 1,
       .doc = "WarmupDecayLR, WarmupCosineLR: optimizer steps until the end of the decay.",
       .set = DS_SET(scheduler.total_num_steps),
       .only_for = kWarmupDecayLRMask | kWarmupCosineLRMask,
       .default_doc = "required by WarmupDecayLR, WarmupCosineLR"},
      {.path = "scheduler.params.warmup_min_ratio",
       .kind = Kind::kFloat,
       .def = F(0.0),
       .min = 0,
       .max = 1,
       .doc = "WarmupCosineLR: lr / optimizer lr at the start of warmup.",
       .set = DS_SET(scheduler.warmup_min_ratio),
       .only_for = kWarmupCosineLRMask},
      {.path = "scheduler.params.cos_min_ratio",
       .kind = Kind::kFloat,
       .def = F(0.0001),
       .min = 0,
       .max = 1,
       .doc = "WarmupCosineLR: lr / optimizer lr at the end of the cosine decay.",
       .set = DS_SET(scheduler.cos_min_ratio),
       .only_for = kWarmupCosineLRMask},
      // ---- precision ----
      {.path = "fp16",
       .kind = Kind::kObject,
       .doc = "fp16 mixed precision with loss scaling (fp32 master weights)."},
      {.path = "fp16.enabled",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Train in fp16. Cannot be combined with bf16.enabled.",
       .set = DS_SET(fp16.enabled)},
      {.path = "fp16.auto_cast",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Cast inputs to fp16 automatically.",
       .set = DS_SET(fp16.auto_cast)},
      {.path = "fp16.loss_scale",
       .kind = Kind::kFloat,
       .def = F(0.0),
       .min = 0,
       .doc = "Static loss scale; 0 selects dynamic loss scaling.",
       .set = DS_SET(fp16.loss_scale)},
      {.path = "fp16.initial_scale_power",
       .kind = Kind::kInt,
       .def = I(16),
       .min = 0,
       .max = 127,
       .doc = "Dynamic scaling starts at 2^initial_scale_power.",
       .set = DS_SET(fp16.initial_scale_power)},
      {.path = "fp16.loss_scale_window",
       .kind = Kind::kInt,
       .def = I(1000),
       .min = 1,
       .doc = "Overflow-free steps before the dynamic scale is doubled.",
       .set = DS_SET(fp16.loss_scale_window)},
      {.path = "fp16.hysteresis",
       .kind = Kind::kInt,
       .def = I(2),
       .min = 1,
       .doc = "Overflows it takes to halve the scale (delayed shift); 1 halves on the first one.",
       .set = DS_SET(fp16.hysteresis)},
      {.path = "fp16.consecutive_hysteresis",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Refill the hysteresis after every overflow-free step.",
       .set = DS_SET(fp16.consecutive_hysteresis)},
      {.path = "fp16.min_loss_scale",
       .kind = Kind::kFloat,
       .def = F(1.0),
       .min = 0,
       .min_exclusive = true,
       .doc = "Floor of the dynamic loss scale.",
       .set = DS_SET(fp16.min_loss_scale)},
      {.path = "fp16.fp16_master_weights_and_grads",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Keep master weights in fp16 (parsed only).",
       .set = DS_SET(fp16.fp16_master_weights_and_grads)},
      {.path = "bf16", .kind = Kind::kObject, .doc = "bfloat16 mixed precision (no loss scaling)."},
      {.path = "bf16.enabled",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Train in bf16. Cannot be combined with fp16.enabled.",
       .set = DS_SET(bf16.enabled)},
      {.path = "bf16.immediate_grad_update",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Apply gradient updates immediately (parsed only).",
       .set = DS_SET(bf16.immediate_grad_update)},
      {.path = "bf16.check_grad_overflow",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Check bf16 gradients for inf/NaN (parsed only).",
       .set = DS_SET(bf16.check_grad_overflow)},
      {.path = "bf16.bf16_master_weights_and_grads",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Keep master weights in bf16 (parsed only).",
       .set = DS_SET(bf16.bf16_master_weights_and_grads)},
      {.path = "bf16.bf16_optimizer_states",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Keep optimizer states in bf16 (parsed only).",
       .set = DS_SET(bf16.bf16_optimizer_states)},
      // ---- ZeRO ----
      {.path = "zero_optimization",
       .kind = Kind::kObject,
       .doc = "ZeRO partitioning (DeepSpeedZeroConfig). Sizes count elements, not bytes."},
      {.path = "zero_optimization.stage",
       .kind = Kind::kInt,
       .def = I(0),
       .min = 0,
       .max = 3,
       .doc = "0 off, 1 optimizer states, 2 + gradients, 3 + parameters partitioned.",
       .set = DS_SET(zero_optimization.stage)},
      {.path = "zero_optimization.contiguous_gradients",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Copy gradients into one contiguous buffer as they are produced.",
       .set = DS_SET(zero_optimization.contiguous_gradients)},
      {.path = "zero_optimization.reduce_scatter",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Average gradients with reduce-scatter instead of all-reduce.",
       .set = DS_SET(zero_optimization.reduce_scatter)},
      {.path = "zero_optimization.reduce_bucket_size",
       .kind = Kind::kInt,
       .def = I(500000000),
       .min = 0,
       .doc = "Elements reduced at a time.",
       .set = DS_SET(zero_optimization.reduce_bucket_size)},
      {.path = "zero_optimization.use_multi_rank_bucket_allreduce",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Combine the reduce buckets of all ranks into one all-reduce.",
       .set = DS_SET(zero_optimization.use_multi_rank_bucket_allreduce)},
      {.path = "zero_optimization.allgather_partitions",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "All-gather updated partitions (instead of a series of broadcasts).",
       .set = DS_SET(zero_optimization.allgather_partitions)},
      {.path = "zero_optimization.allgather_bucket_size",
       .kind = Kind::kInt,
       .def = I(500000000),
       .min = 0,
       .doc = "Elements all-gathered at a time.",
       .set = DS_SET(zero_optimization.allgather_bucket_size)},
      {.path = "zero_optimization.overlap_comm",
       .kind = Kind::kBool,
       .doc = "Overlap gradient reduction with the backward pass.",
       .set = DS_SET(zero_optimization.overlap_comm),
       .default_doc = "true for stage 3, else false"},
      {.path = "zero_optimization.load_from_fp32_weights",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Initialize fp32 master weights from the checkpoint's fp32 copy.",
       .set = DS_SET(zero_optimization.load_from_fp32_weights)},
      {.path = "zero_optimization.elastic_checkpoint",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Load checkpoints saved with another rank count (no longer supported by DeepSpeed).",
       .set = DS_SET(zero_optimization.elastic_checkpoint)},
      {.path = "zero_optimization.offload_param",
       .kind = Kind::kObject,
       .doc = "Parameter offload to CPU or NVMe (stage 3)."},
      {.path = "zero_optimization.offload_param.device",
       .kind = Kind::kEnum,
       .def = S("none"),
       .choices = {"none", "cpu", "nvme"},
       .doc = "Where partitioned parameters live.",
       .set = DS_SET(zero_optimization.offload_param.device)},
      {.path = "zero_optimization.offload_param.nvme_path",
       .kind = Kind::kString,
       .doc = "Directory on the NVMe device; required when device is nvme.",
       .set = DS_SET(zero_optimization.offload_param.nvme_path),
       .nullable = true,
       .default_doc = "null"},
      {.path = "zero_optimization.offload_param.buffer_count",
       .kind = Kind::kInt,
       .def = I(5),
       .min = 0,
       .doc = "Buffers in the NVMe parameter buffer pool.",
       .set = DS_SET(zero_optimization.offload_param.buffer_count)},
      {.path = "zero_optimization.offload_param.buffer_size",
       .kind = Kind::kInt,
       .def = I(100000000),
       .min = 0,
       .doc = "Elements per NVMe parameter buffer.",
       .set = DS_SET(zero_optimization.offload_param.buffer_size)},
      {.path = "zero_optimization.offload_param.max_in_cpu",
       .kind = Kind::kInt,
       .def = I(1000000000),
       .min = 0,
       .doc = "Parameter elements kept in CPU memory when offloading to NVMe.",
       .set = DS_SET(zero_optimization.offload_param.max_in_cpu)},
      {.path = "zero_optimization.offload_param.pin_memory",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Use page-locked CPU memory.",
       .set = DS_SET(zero_optimization.offload_param.pin_memory)},
      {.path = "zero_optimization.offload_optimizer",
       .kind = Kind::kObject,
       .doc = "Optimizer state offload to CPU or NVMe; the optimizer step runs on the CPU."},
      {.path = "zero_optimization.offload_optimizer.device",
       .kind = Kind::kEnum,
       .def = S("none"),
       .choices = {"none", "cpu", "nvme"},
       .doc = "Where optimizer states live.",
       .set = DS_SET(zero_optimization.offload_optimizer.device)},
      {.path = "zero_optimization.offload_optimizer.nvme_path",
       .kind = Kind::kString,
       .doc = "Directory on the NVMe device; required when device is nvme.",
       .set = DS_SET(zero_optimization.offload_optimizer.nvme_path),
       .nullable = true,
       .default_doc = "null"},
      {.path = "zero_optimization.offload_optimizer.buffer_count",
       .kind = Kind::kInt,
       .def = I(4),
       .min = 0,
       .doc = "Buffers in the NVMe optimizer buffer pool (Adam keeps 4 states).",
       .set = DS_SET(zero_optimization.offload_optimizer.buffer_count)},
      {.path = "zero_optimization.offload_optimizer.pin_memory",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Use page-locked CPU memory.",
       .set = DS_SET(zero_optimization.offload_optimizer.pin_memory)},
      {.path = "zero_optimization.offload_optimizer.pipeline_read",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Overlap reading the next tile with computing the current one.",
       .set = DS_SET(zero_optimization.offload_optimizer.pipeline_read)},
      {.path = "zero_optimization.offload_optimizer.pipeline_write",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Overlap writing the previous tile with computing the current one.",
       .set = DS_SET(zero_optimization.offload_optimizer.pipeline_write)},
      {.path = "zero_optimization.offload_optimizer.fast_init",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Fast optimizer initialization when offloading to NVMe.",
       .set = DS_SET(zero_optimization.offload_optimizer.fast_init)},
      {.path = "zero_optimization.offload_optimizer.ratio",
       .kind = Kind::kFloat,
       .def = F(1.0),
       .min = 0,
       .max = 1,
       .doc = "Fraction of optimizer states offloaded; below 1 only with stage 3.",
       .set = DS_SET(zero_optimization.offload_optimizer.ratio)},
      {.path = "zero_optimization.sub_group_size",
       .kind = Kind::kInt,
       .def = I(1000000000),
       .min = 0,
       .doc = "Tile size (elements) of the offloaded optimizer step.",
       .set = DS_SET(zero_optimization.sub_group_size)},
      {.path = "zero_optimization.cpu_offload",
       .kind = Kind::kBool,
       .doc = "Deprecated: true means offload_optimizer.device = cpu.",
       .deprecated = true,
       .nullable = true,
       .default_doc = "null"},
      {.path = "zero_optimization.cpu_offload_param",
       .kind = Kind::kBool,
       .doc = "Deprecated: true means offload_param.device = cpu.",
       .deprecated = true,
       .nullable = true,
       .default_doc = "null"},
      {.path = "zero_optimization.cpu_offload_use_pin_memory",
       .kind = Kind::kBool,
       .doc =
           "Deprecated: pin_memory of the offload sections cpu_offload/cpu_offload_param create.",
       .deprecated = true,
       .nullable = true,
       .default_doc = "null"},
      {.path = "zero_optimization.prefetch_bucket_size",
       .kind = Kind::kInt,
       .def = I(50000000),
       .min = 0,
       .doc = "Stage 3: parameter elements fetched ahead of use.",
       .set = DS_SET(zero_optimization.prefetch_bucket_size)},
      {.path = "zero_optimization.stage3_prefetch_bucket_size",
       .kind = Kind::kInt,
       .min = 0,
       .set = DS_SET(zero_optimization.prefetch_bucket_size),
       .alias_of = "zero_optimization.prefetch_bucket_size"},
      {.path = "zero_optimization.param_persistence_threshold",
       .kind = Kind::kInt,
       .def = I(100000),
       .min = 0,
       .doc = "Stage 3: parameters smaller than this (elements) are not partitioned.",
       .set = DS_SET(zero_optimization.param_persistence_threshold)},
      {.path = "zero_optimization.stage3_param_persistence_threshold",
       .kind = Kind::kInt,
       .min = 0,
       .set = DS_SET(zero_optimization.param_persistence_threshold),
       .alias_of = "zero_optimization.param_persistence_threshold"},
      {.path = "zero_optimization.model_persistence_threshold",
       .kind = Kind::kInt,
       .def = I(std::numeric_limits<int64_t>::max()),
       .min = 0,
       .doc = "Stage 3: upper bound on unpartitioned (persistent) parameter elements.",
       .set = DS_SET(zero_optimization.model_persistence_threshold),
       .default_doc = "sys.maxsize (2^63-1)"},
      {.path = "zero_optimization.stage3_model_persistence_threshold",
       .kind = Kind::kInt,
       .min = 0,
       .set = DS_SET(zero_optimization.model_persistence_threshold),
       .alias_of = "zero_optimization.model_persistence_threshold"},
      {.path = "zero_optimization.max_live_parameters",
       .kind = Kind::kInt,
       .def = I(1000000000),
       .min = 0,
       .doc = "Stage 3: parameter elements resident per rank before releasing.",
       .set = DS_SET(zero_optimization.max_live_parameters)},
      {.path = "zero_optimization.stage3_max_live_parameters",
       .kind = Kind::kInt,
       .min = 0,
       .set = DS_SET(zero_optimization.max_live_parameters),
       .alias_of = "zero_optimization.max_live_parameters"},
      {.path = "zero_optimization.max_reuse_distance",
       .kind = Kind::kInt,
       .def = I(1000000000),
       .min = 0,
       .doc = "Stage 3: keep a parameter resident if it is reused within this many elements.",
       .set = DS_SET(zero_optimization.max_reuse_distance)},
      {.path = "zero_optimization.stage3_max_reuse_distance",
       .kind = Kind::kInt,
       .min = 0,
       .set = DS_SET(zero_optimization.max_reuse_distance),
       .alias_of = "zero_optimization.max_reuse_distance"},
      {.path = "zero_optimization.gather_16bit_weights_on_model_save",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Stage 3: gather the full 16-bit weights when saving the model.",
       .set = DS_SET(zero_optimization.gather_16bit_weights_on_model_save)},
      {.path = "zero_optimization.stage3_gather_16bit_weights_on_model_save",
       .kind = Kind::kBool,
       .set = DS_SET(zero_optimization.gather_16bit_weights_on_model_save),
       .alias_of = "zero_optimization.gather_16bit_weights_on_model_save"},
      {.path = "zero_optimization.stage3_gather_fp16_weights_on_model_save",
       .kind = Kind::kBool,
       .set = DS_SET(zero_optimization.gather_16bit_weights_on_model_save),
       .alias_of = "zero_optimization.gather_16bit_weights_on_model_save",
       .deprecated = true},
      {.path = "zero_optimization.module_granularity_threshold",
       .kind = Kind::kInt,
       .def = I(0),
       .min = 0,
       .doc = "Stage 3: modules finer than this are fetched as one unit.",
       .set = DS_SET(zero_optimization.module_granularity_threshold)},
      {.path = "zero_optimization.stage3_module_granularity_threshold",
       .kind = Kind::kInt,
       .min = 0,
       .set = DS_SET(zero_optimization.module_granularity_threshold),
       .alias_of = "zero_optimization.module_granularity_threshold"},
      {.path = "zero_optimization.use_all_reduce_for_fetch_params",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Stage 3: fetch parameters with all-reduce instead of all-gather.",
       .set = DS_SET(zero_optimization.use_all_reduce_for_fetch_params)},
      {.path = "zero_optimization.stage3_use_all_reduce_for_fetch_params",
       .kind = Kind::kBool,
       .set = DS_SET(zero_optimization.use_all_reduce_for_fetch_params),
       .alias_of = "zero_optimization.use_all_reduce_for_fetch_params"},
      {.path = "zero_optimization.ignore_unused_parameters",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Stage 2: do not fail on parameters that get no gradient.",
       .set = DS_SET(zero_optimization.ignore_unused_parameters)},
      {.path = "zero_optimization.legacy_stage1",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "DeepSpeed's old stage 1 implementation (parsed only).",
       .set = DS_SET(zero_optimization.legacy_stage1)},
      {.path = "zero_optimization.round_robin_gradients",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Stage 1/2 with offload: spread gradient copies over ranks.",
       .set = DS_SET(zero_optimization.round_robin_gradients)},
      {.path = "zero_optimization.zero_hpz_partition_size",
       .kind = Kind::kInt,
       .def = I(1),
       .min = 0,
       .doc = "ZeRO++ hierarchical partitioning: ranks in the secondary group.",
       .set = DS_SET(zero_optimization.zero_hpz_partition_size)},
      {.path = "zero_optimization.zero_quantized_weights",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "ZeRO++: quantize weights for the all-gather.",
       .set = DS_SET(zero_optimization.zero_quantized_weights)},
      {.path = "zero_optimization.zero_quantized_nontrainable_weights",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "ZeRO++: store non-trainable weights quantized.",
       .set = DS_SET(zero_optimization.zero_quantized_nontrainable_weights)},
      {.path = "zero_optimization.zero_quantized_gradients",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "ZeRO++: quantize gradients for the reduction.",
       .set = DS_SET(zero_optimization.zero_quantized_gradients)},
      {.path = "zero_optimization.zeropp_loco_param",
       .kind = Kind::kObject,
       .doc = "LoCo-ZeRO++ error feedback for quantized gradients.",
       .nullable = true},
      {.path = "zero_optimization.zeropp_loco_param.err_beta",
       .kind = Kind::kFloat,
       .def = F(0.8),
       .min = 0,
       .max = 1,
       .doc = "Moving-average coefficient of the quantization error.",
       .set = DS_SET(zero_optimization.zeropp_loco_param.err_beta)},
      {.path = "zero_optimization.zeropp_loco_param.reset_T",
       .kind = Kind::kInt,
       .def = I(1024),
       .min = 1,
       .doc = "Steps after which the error buffer is cleared.",
       .set = DS_SET(zero_optimization.zeropp_loco_param.reset_t)},
      {.path = "zero_optimization.mics_shard_size",
       .kind = Kind::kInt,
       .def = I(-1),
       .min = -1,
       .doc = "MiCS shard group size; -1 turns MiCS off.",
       .set = DS_SET(zero_optimization.mics_shard_size)},
      {.path = "zero_optimization.mics_hierarchical_params_gather",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "MiCS: hierarchical all-gather of parameters.",
       .set = DS_SET(zero_optimization.mics_hierarchical_params_gather)},
      {.path = "zero_optimization.memory_efficient_linear",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Stage 3: memory-efficient linear layer.",
       .set = DS_SET(zero_optimization.memory_efficient_linear)},
      {.path = "zero_optimization.pipeline_loading_checkpoint",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Stage 3: load checkpoints in pipeline mode.",
       .set = DS_SET(zero_optimization.pipeline_loading_checkpoint)},
      {.path = "zero_optimization.override_module_apply",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Stage 3: override nn.Module.apply (parsed only).",
       .set = DS_SET(zero_optimization.override_module_apply)},
      {.path = "zero_optimization.log_trace_cache_warnings",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Stage 3: log warnings of the parameter trace cache.",
       .set = DS_SET(zero_optimization.log_trace_cache_warnings)},
      // ---- async I/O ----
      {.path = "aio", .kind = Kind::kObject, .doc = "Asynchronous I/O for NVMe offload."},
      {.path = "aio.block_size",
       .kind = Kind::kInt,
       .def = I(1048576),
       .min = 1,
       .doc = "Bytes per I/O request.",
       .set = DS_SET(aio.block_size)},
      {.path = "aio.queue_depth",
       .kind = Kind::kInt,
       .def = I(8),
       .min = 1,
       .doc = "I/O requests in flight.",
       .set = DS_SET(aio.queue_depth)},
      {.path = "aio.thread_count",
       .kind = Kind::kInt,
       .def = I(1),
       .min = 1,
       .doc = "I/O threads per rank.",
       .set = DS_SET(aio.thread_count)},
      {.path = "aio.single_submit",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Submit requests one at a time instead of in batches.",
       .set = DS_SET(aio.single_submit)},
      {.path = "aio.overlap_events",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Submit new requests while waiting for completions.",
       .set = DS_SET(aio.overlap_events)},
      // ---- monitoring ----
      {.path = "csv_monitor", .kind = Kind::kObject, .doc = "Write training metrics to CSV files."},
      {.path = "csv_monitor.enabled",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Turn the CSV monitor on.",
       .set = DS_SET(csv_monitor.enabled)},
      {.path = "csv_monitor.output_path",
       .kind = Kind::kString,
       .def = S(""),
       .doc = "Directory for the CSV files.",
       .set = DS_SET(csv_monitor.output_path)},
      {.path = "csv_monitor.job_name",
       .kind = Kind::kString,
       .def = S("DeepSpeedJobName"),
       .doc = "Subdirectory name of this run.",
       .set = DS_SET(csv_monitor.job_name)},
      {.path = "tensorboard", .kind = Kind::kObject, .doc = "TensorBoard event files."},
      {.path = "tensorboard.enabled",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Turn TensorBoard logging on.",
       .set = DS_SET(tensorboard.enabled)},
      {.path = "tensorboard.output_path",
       .kind = Kind::kString,
       .def = S(""),
       .doc = "Directory for the event files.",
       .set = DS_SET(tensorboard.output_path)},
      {.path = "tensorboard.job_name",
       .kind = Kind::kString,
       .def = S("DeepSpeedJobName"),
       .doc = "Subdirectory name of this run.",
       .set = DS_SET(tensorboard.job_name)},
      {.path = "wandb",
       .kind = Kind::kObject,
       .doc = "Weights & Biases logging: parsed, but enabled = true is an error (not supported)."},
      {.path = "wandb.enabled",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Must stay false in dsactor.",
       .set = DS_SET(wandb.enabled)},
      {.path = "wandb.group",
       .kind = Kind::kString,
       .doc = "W&B group.",
       .set = DS_SET(wandb.group),
       .nullable = true,
       .default_doc = "null"},
      {.path = "wandb.team",
       .kind = Kind::kString,
       .doc = "W&B team.",
       .set = DS_SET(wandb.team),
       .nullable = true,
       .default_doc = "null"},
      {.path = "wandb.project",
       .kind = Kind::kString,
       .def = S("deepspeed"),
       .doc = "W&B project.",
       .set = DS_SET(wandb.project)},
      {.path = "comms_logger", .kind = Kind::kObject, .doc = "Log collective operations."},
      {.path = "comms_logger.enabled",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Turn the communication logger on.",
       .set = DS_SET(comms_logger.enabled)},
      {.path = "comms_logger.verbose",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Log every operation as it happens.",
       .set = DS_SET(comms_logger.verbose)},
      {.path = "comms_logger.prof_all",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Profile all operations.",
       .set = DS_SET(comms_logger.prof_all)},
      {.path = "comms_logger.debug",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Include the caller in the log.",
       .set = DS_SET(comms_logger.debug)},
      {.path = "comms_logger.prof_ops",
       .kind = Kind::kStringList,
       .def = Value(std::vector<std::string>{}),
       .doc = "Operations to profile when prof_all is false.",
       .set = DS_SET(comms_logger.prof_ops)},
      {.path = "flops_profiler", .kind = Kind::kObject, .doc = "FLOPs profiler."},
      {.path = "flops_profiler.enabled",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Turn the profiler on.",
       .set = DS_SET(flops_profiler.enabled)},
      {.path = "flops_profiler.recompute_fwd_factor",
       .kind = Kind::kFloat,
       .def = F(0.0),
       .min = 0,
       .doc = "Extra forward passes due to activation recomputation.",
       .set = DS_SET(flops_profiler.recompute_fwd_factor)},
      {.path = "flops_profiler.profile_step",
       .kind = Kind::kInt,
       .def = I(1),
       .min = 0,
       .doc = "Step at which to profile.",
       .set = DS_SET(flops_profiler.profile_step)},
      {.path = "flops_profiler.module_depth",
       .kind = Kind::kInt,
       .def = I(-1),
       .min = -1,
       .doc = "Module depth to report; -1 = all.",
       .set = DS_SET(flops_profiler.module_depth)},
      {.path = "flops_profiler.top_modules",
       .kind = Kind::kInt,
       .def = I(1),
       .min = 0,
       .doc = "Top modules to list.",
       .set = DS_SET(flops_profiler.top_modules)},
      {.path = "flops_profiler.detailed",
       .kind = Kind::kBool,
       .def = B(true),
       .doc = "Print the detailed per-module profile.",
       .set = DS_SET(flops_profiler.detailed)},
      {.path = "flops_profiler.output_file",
       .kind = Kind::kString,
       .doc = "File for the profile; null = stdout.",
       .set = DS_SET(flops_profiler.output_file),
       .nullable = true,
       .default_doc = "null"},
      {.path = "activation_checkpointing",
       .kind = Kind::kObject,
       .doc = "Activation checkpointing: parsed and validated; dsactor does not act on these "
              "keys yet."},
      {.path = "activation_checkpointing.partition_activations",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Partition checkpointed activations over model-parallel ranks.",
       .set = DS_SET(activation_checkpointing.partition_activations)},
      {.path = "activation_checkpointing.cpu_checkpointing",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Offload checkpointed activations to CPU.",
       .set = DS_SET(activation_checkpointing.cpu_checkpointing)},
      {.path = "activation_checkpointing.contiguous_memory_optimization",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Copy checkpoints into one contiguous buffer.",
       .set = DS_SET(activation_checkpointing.contiguous_memory_optimization)},
      {.path = "activation_checkpointing.number_checkpoints",
       .kind = Kind::kInt,
       .min = 1,
       .doc = "Checkpoints per pass (needed by contiguous_memory_optimization).",
       .set = DS_SET(activation_checkpointing.number_checkpoints),
       .nullable = true,
       .default_doc = "null"},
      {.path = "activation_checkpointing.synchronize_checkpoint_boundary",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Synchronize the device at each checkpoint boundary.",
       .set = DS_SET(activation_checkpointing.synchronize_checkpoint_boundary)},
      {.path = "activation_checkpointing.profile",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Time the checkpointing functions.",
       .set = DS_SET(activation_checkpointing.profile)},
      // ---- checkpoints and data types ----
      {.path = "checkpoint", .kind = Kind::kObject, .doc = "Checkpoint behaviour."},
      {.path = "checkpoint.tag_validation",
       .kind = Kind::kEnum,
       .def = S("Warn"),
       .choices = {"Warn", "Ignore", "Fail"},
       .icase = true,
       .doc = "What to do when ranks save under different tags.",
       .set = DS_SET(checkpoint.tag_validation)},
      {.path = "checkpoint.load_universal",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Load a universal (topology-independent) checkpoint.",
       .set = DS_SET(checkpoint.load_universal)},
      {.path = "checkpoint.use_node_local_storage",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "Each node writes its own copy to node-local storage.",
       .set = DS_SET(checkpoint.use_node_local_storage)},
      {.path = "checkpoint.parallel_write",
       .kind = Kind::kObject,
       .doc = "Parallel checkpoint writing."},
      {.path = "checkpoint.parallel_write.pipeline_stage",
       .kind = Kind::kBool,
       .def = B(false),
       .doc = "One writer per pipeline stage.",
       .set = DS_SET(checkpoint.parallel_write_pipeline_stage)},
      {.path = "data_types", .kind = Kind::kObject, .doc = "Data types of internal buffers."},
      {.path = "data_types.grad_accum_dtype",
       .kind = Kind::kEnum,
       .choices = {"fp16", "bf16", "fp32"},
       .icase = true,
       .doc = "Gradient accumulation buffer type; null = the training precision.",
       .set = DS_SET(grad_accum_dtype),
       .nullable = true},
      {.path = "gradient_accumulation_dtype",
       .kind = Kind::kEnum,
       .choices = {"fp16", "bf16", "fp32"},
       .icase = true,
       .doc = "DeepSpeed itself ignores this spelling, found in many configs; dsactor reads it as "
              "data_types.grad_accum_dtype",
       .set = DS_SET(grad_accum_dtype),
       .alias_of = "data_types.grad_accum_dtype",
       .deprecated = true,
       .nullable = true},
  };
  return table;
}

#undef DS_SET

std::string_view parent_of(std::string_view path) {
  const auto dot = path.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : path.substr(0, dot);
}
std::string_view leaf_of(std::string_view path) {
  const auto dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}
const KeySpec* find_spec(std::string_view path) {
  for (const auto& s : key_table())
    if (s.path == path) return &s;
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

std::string fmt_number(double d) {
  if (d == std::floor(d) && std::fabs(d) < 1e15) return fmt::format("{}", static_cast<int64_t>(d));
  return fmt::format("{}", d);
}

std::string quoted_list(const std::vector<std::string_view>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", \"" : "\"") + std::string(v[i]) + "\"";
  return out;
}

std::string range_text(const KeySpec& s) {
  const bool lo = s.min > -kInf, hi = s.max < kInf;
  if (lo && hi) return fmt::format(" in [{}, {}]", fmt_number(s.min), fmt_number(s.max));
  if (lo) return fmt::format(" {} {}", s.min_exclusive ? ">" : ">=", fmt_number(s.min));
  if (hi) return fmt::format(" <= {}", fmt_number(s.max));
  return "";
}

// What a key accepts, in words: used by errors and the reference page alike.
std::string allowed_text(const KeySpec& s) {
  std::string t;
  switch (s.kind) {
    case Kind::kBool:
      t = "true or false";
      break;
    case Kind::kInt:
      t = "an integer" + range_text(s);
      break;
    case Kind::kFloat:
      t = "a number" + range_text(s);
      break;
    case Kind::kString:
      t = "a string";
      break;
    case Kind::kEnum:
      t = "one of " + quoted_list(s.choices) + (s.icase ? " (any case)" : "");
      break;
    case Kind::kFloatPair:
      t = "a list of two numbers" + range_text(s);
      break;
    case Kind::kStringList:
      t = "a list of strings";
      break;
    case Kind::kObject:
      t = "an object";
      break;
  }
  if (s.nullable) t += " or null";
  return t;
}

std::string value_doc(const Value& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>)
          return "null";
        else if constexpr (std::is_same_v<T, bool>)
          return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, int64_t>)
          return fmt::format("{}", x);
        else if constexpr (std::is_same_v<T, double>)
          return fmt::format("{}", x);
        else if constexpr (std::is_same_v<T, std::string>)
          return "\"" + x + "\"";
        else if constexpr (std::is_same_v<T, std::vector<double>>) {
          std::string out = "[";
          for (size_t i = 0; i < x.size(); ++i) out += (i ? ", " : "") + fmt::format("{}", x[i]);
          return out + "]";
        } else {
          return x.empty() ? std::string("[]") : std::string("[...]");
        }
      },
      v);
}

std::string default_text(const KeySpec& s) {
  if (!s.default_doc.empty()) return std::string(s.default_doc);
  if (s.kind == Kind::kObject) return "";
  if (std::holds_alternative<std::monostate>(s.def)) return s.nullable ? "null" : "none";
  return value_doc(s.def);
}

std::string shown(const json& v) {
  std::string d = v.dump();
  if (d.size() > 60) d = d.substr(0, 57) + "...";
  return d;
}

const char* json_type_name(const json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number_float()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "list";
  if (v.is_object()) return "object";
  return "null";
}

struct Ctx {
  const std::string& source;
  DsConfig& cfg;
  std::set<std::string> present;       // canonical paths of keys the file gives
  std::map<std::string, Value> given;  // canonical path -> parsed value
};

[[noreturn]] void fail(const Ctx& ctx, std::string_view path, const std::string& msg) {
  throw ConfigError(fmt::format("{}: {}: {}", ctx.source, path, msg));
}

[[noreturn]] void fail_type(const Ctx& ctx, const KeySpec& s, std::string_view path,
                            const json& v) {
  fail(ctx, path,
       fmt::format("expected {}, got {} {}", allowed_text(s), json_type_name(v), shown(v)));
}

void check_range(const Ctx& ctx, const KeySpec& s, std::string_view path, double x, const json& v) {
  const bool below = s.min_exclusive ? !(x > s.min) : x < s.min;
  if (below || x > s.max)
    fail(ctx, path,
         fmt::format("value {} is out of range; allowed: {}", shown(v), allowed_text(s)));
}

double read_number(const Ctx& ctx, const KeySpec& s, std::string_view path, const json& v) {
  if (!v.is_number()) fail_type(ctx, s, path, v);
  const double x = v.get<double>();
  if (!std::isfinite(x)) fail_type(ctx, s, path, v);
  return x;
}

Value read_leaf(const Ctx& ctx, const KeySpec& s, std::string_view path, const json& v) {
  if (v.is_string() && lower(v.get<std::string>()) == "auto" && s.kind != Kind::kString)
    fail(ctx, path,
         fmt::format("\"auto\" is a placeholder the Hugging Face integration fills in; dsactor "
                     "reads the file as it is and needs a concrete value: {}",
                     allowed_text(s)));
  if (v.is_null()) {
    if (s.nullable) return {};
    fail_type(ctx, s, path, v);
  }
  switch (s.kind) {
    case Kind::kBool:
      if (!v.is_boolean()) fail_type(ctx, s, path, v);
      return v.get<bool>();
    case Kind::kInt: {
      int64_t i = 0;
      if (v.is_number_integer()) {
        i = v.get<int64_t>();
      } else if (v.is_number_unsigned()) {
        if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          fail(ctx, path,
               fmt::format("value {} is too large; allowed: {}", shown(v), allowed_text(s)));
        i = static_cast<int64_t>(v.get<uint64_t>());
      } else if (v.is_number_float()) {
        // DeepSpeed configs write sizes as 2e8, which JSON reads as a float.
        const double x = read_number(ctx, s, path, v);
        if (x != std::floor(x) || std::fabs(x) >= 9.2e18)
          fail(ctx, path,
               fmt::format("value {} is not an integer; allowed: {}", shown(v), allowed_text(s)));
        i = static_cast<int64_t>(x);
      } else {
        fail_type(ctx, s, path, v);
      }
      check_range(ctx, s, path, static_cast<double>(i), v);
      return i;
    }
    case Kind::kFloat: {
      const double x = read_number(ctx, s, path, v);
      check_range(ctx, s, path, x, v);
      return x;
    }
    case Kind::kString:
      if (!v.is_string()) fail_type(ctx, s, path, v);
      return v.get<std::string>();
    case Kind::kEnum: {
      if (!v.is_string()) fail_type(ctx, s, path, v);
      const auto str = v.get<std::string>();
      for (auto c : s.choices)
        if (s.icase ? lower(c) == lower(str) : c == str) return std::string(c);
      for (auto u : s.unsupported)
        if (lower(u) == lower(str))
          fail(ctx, path,
               fmt::format("\"{}\" is a DeepSpeed choice dsactor does not support; supported: {}",
                           str, quoted_list(s.choices)));
      std::vector<std::string> cands(s.choices.begin(), s.choices.end());
      const auto near = nearest(str, cands);
      fail(ctx, path,
           fmt::format("value \"{}\" is not allowed; allowed: {}{}", str, allowed_text(s),
                       near ? fmt::format(" (did you mean \"{}\"?)", *near) : std::string()));
    }
    case Kind::kFloatPair: {
      if (!v.is_array() || v.size() != 2) fail_type(ctx, s, path, v);
      std::vector<double> out;
      for (const auto& e : v) {
        const double x = read_number(ctx, s, path, e);
        check_range(ctx, s, path, x, v);
        out.push_back(x);
      }
      return out;
    }
    case Kind::kStringList: {
      if (!v.is_array()) fail_type(ctx, s, path, v);
      std::vector<std::string> out;
      for (const auto& e : v) {
        if (!e.is_string()) fail_type(ctx, s, path, v);
        out.push_back(e.get<std::string>());
      }
      return out;
    }
    case Kind::kObject:
      break;
  }
  fail_type(ctx, s, path, v);
}

std::string join_path(std::string_view prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : fmt::format("{}.{}", prefix, key);
}

[[noreturn]] void fail_unknown(const Ctx& ctx, std::string_view prefix, const std::string& key,
                               const std::vector<const KeySpec*>& children) {
  std::vector<std::string> siblings;
  for (const auto* c : children) siblings.emplace_back(leaf_of(c->path));
  std::string hint;
  if (auto near = nearest(key, siblings)) {
    hint = fmt::format("; did you mean \"{}\"?", join_path(prefix, *near));
  } else {
    // A known key at the wrong level ("stage" at the top) is a common slip.
    for (const auto& s : key_table())
      if (leaf_of(s.path) == key) {
        hint = fmt::format("; did you mean \"{}\"?", s.path);
        break;
      }
  }
  const std::string where = prefix.empty() ? "at the top level" : fmt::format("in {}", prefix);
  fail(ctx, join_path(prefix, key),
       fmt::format("unknown key{}; keys allowed {}: {}", hint, where, fmt::join(siblings, ", ")));
}

void parse_object(Ctx& ctx, std::string_view prefix, const json& obj) {
  std::vector<const KeySpec*> children;
  for (const auto& s : key_table())
    if (parent_of(s.path) == prefix) children.push_back(&s);

  for (const auto& [key, _] : obj.items()) {
    const bool known = std::any_of(children.begin(), children.end(),
                                   [&](const KeySpec* c) { return leaf_of(c->path) == key; });
    if (!known) fail_unknown(ctx, prefix, key, children);
  }
  for (const auto* s : children) {
    const auto leaf = std::string(leaf_of(s->path));
    if (!obj.contains(leaf)) continue;
    const json& v = obj.at(leaf);
    const std::string canonical(s->alias_of.empty() ? s->path : s->alias_of);
    if (ctx.present.count(canonical))
      fail(ctx, s->path,
           fmt::format("gives the same setting as {}, which is also given; keep one of them",
                       canonical));
    ctx.present.insert(canonical);
    if (s->deprecated)
      ctx.cfg.warnings.push_back(fmt::format(
          "{}: {} is deprecated{}{}", ctx.source, s->path,
          s->alias_of.empty() ? std::string() : fmt::format("; use {}", s->alias_of),
          s->alias_of.empty() || s->doc.empty() ? std::string() : fmt::format(" ({})", s->doc)));
    if (s->kind == Kind::kObject) {
      if (v.is_null() && s->nullable) continue;
      if (!v.is_object()) fail_type(ctx, *s, s->path, v);
      parse_object(ctx, s->path, v);
      continue;
    }
    Value val = read_leaf(ctx, *s, s->path, v);
    if (s->set) s->set(ctx.cfg, val);
    ctx.given[canonical] = std::move(val);
  }
}

bool given(const Ctx& ctx, const char* path) {
  return ctx.present.count(path) > 0;
}

void resolve_batch(Ctx& ctx) {
  auto& c = ctx.cfg;
  const bool tb = given(ctx, "train_batch_size");
  const bool mb = given(ctx, "train_micro_batch_size_per_gpu");
  const bool ga = given(ctx, "gradient_accumulation_steps");
  const int64_t w = c.world_size;
  std::string derived;
  // DeepSpeed's _set_batch_related_parameters, including its floor divisions.
  if (tb && mb && ga) {
  } else if (tb && mb) {
    c.gradient_accumulation_steps = c.train_batch_size / c.train_micro_batch_size_per_gpu / w;
    derived = fmt::format(
        "gradient_accumulation_steps = train_batch_size ({}) // "
        "train_micro_batch_size_per_gpu ({}) // world_size ({}) = {}",
        c.train_batch_size, c.train_micro_batch_size_per_gpu, w, c.gradient_accumulation_steps);
  } else if (tb && ga) {
    c.train_micro_batch_size_per_gpu = c.train_batch_size / w / c.gradient_accumulation_steps;
    derived = fmt::format(
        "train_micro_batch_size_per_gpu = train_batch_size ({}) // world_size "
        "({}) // gradient_accumulation_steps ({}) = {}",
        c.train_batch_size, w, c.gradient_accumulation_steps, c.train_micro_batch_size_per_gpu);
  } else if (mb && ga) {
    c.train_batch_size = c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * w;
  } else if (tb) {
    c.gradient_accumulation_steps = 1;
    c.train_micro_batch_size_per_gpu = c.train_batch_size / w;
    derived = fmt::format(
        "train_micro_batch_size_per_gpu = train_batch_size ({}) // world_size "
        "({}) = {} (gradient_accumulation_steps = 1)",
        c.train_batch_size, w, c.train_micro_batch_size_per_gpu);
  } else if (mb) {
    c.gradient_accumulation_steps = 1;
    c.train_batch_size = c.train_micro_batch_size_per_gpu * w;
  } else {
    fail(ctx, "train_batch_size",
         "missing: give train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed derives "
         "the others from train_batch_size = train_micro_batch_size_per_gpu * "
         "gradient_accumulation_steps * world_size)");
  }
  if (c.train_micro_batch_size_per_gpu < 1)
    fail(ctx, "train_micro_batch_size_per_gpu",
         fmt::format("derived value is {} ({}); it must be >= 1", c.train_micro_batch_size_per_gpu,
                     derived));
  if (c.gradient_accumulation_steps < 1)
    fail(ctx, "gradient_accumulation_steps",
         fmt::format("derived value is {} ({}); it must be >= 1", c.gradient_accumulation_steps,
                     derived));
  const int64_t product = c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * w;
  if (c.train_batch_size != product)
    fail(ctx, "train_batch_size",
         fmt::format("train_batch_size ({}) != train_micro_batch_size_per_gpu ({}) * "
                     "gradient_accumulation_steps ({}) * world_size ({}) = {}{}",
                     c.train_batch_size, c.train_micro_batch_size_per_gpu,
                     c.gradient_accumulation_steps, w, product,
                     derived.empty() ? std::string() : fmt::format(" (derived: {})", derived)));
}

void resolve_optimizer_and_scheduler(Ctx& ctx) {
  auto& c = ctx.cfg;
  c.optimizer.present = given(ctx, "optimizer");
  if (c.optimizer.present && !given(ctx, "optimizer.type"))
    fail(ctx, "optimizer.type",
         "missing: an optimizer section needs a type; allowed: " +
             allowed_text(*find_spec("optimizer.type")));
  // DeepSpeed: "Optimizer name of Adam forces AdamW logic unless adam_w_mode is explicitly set"
  // and AdamW always means decoupled weight decay.
  if (c.optimizer.type == OptimizerType::kAdamW) c.optimizer.adam_w_mode = true;

  if (!given(ctx, "scheduler")) {
    c.scheduler.type = SchedulerType::kNone;
    return;
  }
  if (!given(ctx, "scheduler.type"))
    fail(ctx, "scheduler.type",
         "missing: a scheduler section needs a type; allowed: " +
             allowed_text(*find_spec("scheduler.type")));
  const auto type_name = std::get<std::string>(ctx.given.at("scheduler.type"));
  const unsigned mask = c.scheduler.type == SchedulerType::kWarmupLR        ? kWarmupLRMask
                        : c.scheduler.type == SchedulerType::kWarmupDecayLR ? kWarmupDecayLRMask
                                                                            : kWarmupCosineLRMask;
  std::vector<std::string> accepted;
  for (const auto& s : key_table())
    if (s.only_for & mask) accepted.emplace_back(leaf_of(s.path));
  for (const auto& s : key_table()) {
    if (!s.only_for || !ctx.present.count(std::string(s.path))) continue;
    if (!(s.only_for & mask))
      fail(ctx, s.path,
           fmt::format("is not a parameter of {}; {} takes: {}", type_name, type_name,
                       fmt::join(accepted, ", ")));
  }
  if ((mask & (kWarmupDecayLRMask | kWarmupCosineLRMask)) &&
      !given(ctx, "scheduler.params.total_num_steps"))
    fail(ctx, "scheduler.params.total_num_steps",
         fmt::format("missing: {} requires total_num_steps ({})", type_name,
                     allowed_text(*find_spec("scheduler.params.total_num_steps"))));
}

void resolve_zero(Ctx& ctx) {
  auto& z = ctx.cfg.zero_optimization;
  if (!given(ctx, "zero_optimization.overlap_comm")) z.overlap_comm = z.stage == 3;

  // Deprecated booleans, mapped the way DeepSpeed's new_param_fn does.
  auto flag = [&](const char* path) {
    auto it = ctx.given.find(path);
    return it != ctx.given.end() && std::holds_alternative<bool>(it->second) &&
           std::get<bool>(it->second);
  };
  const bool pin = flag("zero_optimization.cpu_offload_use_pin_memory");
  if (flag("zero_optimization.cpu_offload")) {
    if (given(ctx, "zero_optimization.offload_optimizer"))
      fail(ctx, "zero_optimization.cpu_offload",
           "deprecated key given together with its replacement "
           "zero_optimization.offload_optimizer; keep only offload_optimizer");
    z.offload_optimizer.device = OffloadDevice::kCpu;
    z.offload_optimizer.pin_memory = pin;
  }
  if (flag("zero_optimization.cpu_offload_param")) {
    if (given(ctx, "zero_optimization.offload_param"))
      fail(ctx, "zero_optimization.cpu_offload_param",
           "deprecated key given together with its replacement "
           "zero_optimization.offload_param; keep only offload_param");
    z.offload_param.device = OffloadDevice::kCpu;
    z.offload_param.pin_memory = pin;
  }

  if (z.offload_param.device == OffloadDevice::kNvme && z.offload_param.nvme_path.empty())
    fail(ctx, "zero_optimization.offload_param.nvme_path",
         "missing: offload_param.device is \"nvme\", which needs nvme_path (a directory on the "
         "NVMe device)");
  if (z.offload_optimizer.device == OffloadDevice::kNvme && z.offload_optimizer.nvme_path.empty())
    fail(ctx, "zero_optimization.offload_optimizer.nvme_path",
         "missing: offload_optimizer.device is \"nvme\", which needs nvme_path (a directory on "
         "the NVMe device)");
  if (z.offload_optimizer.enabled() && z.offload_optimizer.ratio < 1.0 && z.stage != 3)
    fail(ctx, "zero_optimization.offload_optimizer.ratio",
         fmt::format("value {} (partial offload) is only allowed with zero_optimization.stage 3, "
                     "stage is {}",
                     z.offload_optimizer.ratio, z.stage));
  z.zeropp_loco_param.present = given(ctx, "zero_optimization.zeropp_loco_param");
}

void resolve_rest(Ctx& ctx) {
  auto& c = ctx.cfg;
  if (c.fp16.enabled && c.bf16.enabled)
    fail(ctx, "fp16.enabled",
         "fp16.enabled and bf16.enabled are both true; enable at most one of them");
  if (c.wandb.enabled)
    fail(ctx, "wandb.enabled",
         "Weights & Biases logging is not supported by dsactor; set it to false and use "
         "csv_monitor or tensorboard");
}

void apply_defaults(DsConfig& c) {
  for (const auto& s : key_table()) {
    if (!s.set || !s.alias_of.empty() || s.kind == Kind::kObject) continue;
    if (std::holds_alternative<std::monostate>(s.def) && !s.nullable) continue;
    s.set(c, s.def);
  }
}

bool all_digits(std::string_view s, int base) {
  if (s.empty()) return false;
  for (char ch : s) {
    const bool ok = base == 16  ? std::isxdigit(static_cast<unsigned char>(ch)) != 0
                    : base == 8 ? ch >= '0' && ch <= '7'
                                : ch >= '0' && ch <= '9';
    if (!ok) return false;
  }
  return true;
}

// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?, the YAML 1.2 core float (so 2e8 is one).
bool is_yaml_float(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t b = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i - b;
  };
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  const size_t int_digits = digits();
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    frac_digits = digits();
  }
  if (int_digits == 0 && frac_digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

// YAML 1.2 core-schema typing of a plain (unquoted) scalar.
json yaml_scalar(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  const std::string_view unsigned_part =
      !s.empty() && (s[0] == '+' || s[0] == '-') ? std::string_view(s).substr(1) : s;
  try {
    if (all_digits(unsigned_part, 10)) return std::stoll(s);
    if (s.rfind("0x", 0) == 0 && all_digits(std::string_view(s).substr(2), 16))
      return std::stoll(s.substr(2), nullptr, 16);
    if (s.rfind("0o", 0) == 0 && all_digits(std::string_view(s).substr(2), 8))
      return std::stoll(s.substr(2), nullptr, 8);
  } catch (const std::out_of_range&) {
    return std::stod(s);  // beyond int64: keep it as a number; range checks report it
  }
  if (is_yaml_float(s)) return std::stod(s);
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf")
    return std::numeric_limits<double>::infinity();
  if (s == "-.inf" || s == "-.Inf" || s == "-.INF") return -std::numeric_limits<double>::infinity();
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return std::numeric_limits<double>::quiet_NaN();
  return s;
}

json yaml_to_json(const YAML::Node& n, const std::string& source) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      // Quoted scalars carry the "!" tag and stay strings.
      return n.Tag() == "!" ? json(n.Scalar()) : yaml_scalar(n.Scalar());
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& e : n) a.push_back(yaml_to_json(e, source));
      return a;
    }
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) {
        const auto key = kv.first.as<std::string>();
        if (o.contains(key))
          throw ConfigError(
              fmt::format("{}:{}: duplicate key \"{}\"", source, kv.first.Mark().line + 1, key));
        o[key] = yaml_to_json(kv.second, source);
      }
      return o;
    }
  }
  return nullptr;
}

// DeepSpeed loads JSON with a hook that rejects duplicate keys; so do we.
json parse_json_text(const std::string& text, const std::string& source) {
  std::vector<std::set<std::string>> keys;
  std::string dup;
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) keys.emplace_back();
    if (ev == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (ev == json::parse_event_t::key && !keys.empty() && dup.empty()) {
      const auto k = parsed.get<std::string>();
      if (!keys.back().insert(k).second) dup = k;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, cb);
  } catch (const json::parse_error& e) {
    throw ConfigError(fmt::format("{}: invalid JSON: {}", source, e.what()));
  }
  if (!dup.empty()) throw ConfigError(fmt::format("{}: duplicate key \"{}\"", source, dup));
  return j;
}

}  // namespace

const char* to_string(OptimizerType t) {
  return t == OptimizerType::kAdamW ? "AdamW" : "Adam";
}
const char* to_string(SchedulerType t) {
  switch (t) {
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
    case SchedulerType::kNone:
      break;
  }
  return "none";
}
const char* to_string(OffloadDevice d) {
  return d == OffloadDevice::kCpu ? "cpu" : d == OffloadDevice::kNvme ? "nvme" : "none";
}

DsConfig parse_ds_config(const nlohmann::json& j, const std::string& source, int world_size) {
  DsConfig cfg;
  cfg.source = source;
  if (world_size < 1)
    throw ConfigError(
        fmt::format("{}: world_size {} is invalid; it must be >= 1", source, world_size));
  cfg.world_size = world_size;
  apply_defaults(cfg);
  Ctx ctx{source, cfg, {}, {}};
  if (!j.is_object())
    throw ConfigError(
        fmt::format("{}: the top level must be an object, got {}", source, json_type_name(j)));
  parse_object(ctx, "", j);
  resolve_batch(ctx);
  resolve_optimizer_and_scheduler(ctx);
  resolve_zero(ctx);
  resolve_rest(ctx);
  return cfg;
}

nlohmann::json yaml_text_to_json(const std::string& yaml_text, const std::string& source) {
  try {
    return yaml_to_json(YAML::Load(yaml_text), source);
  } catch (const YAML::Exception& e) {
    // Also covers non-scalar map keys, which have no JSON equivalent.
    throw ConfigError(fmt::format("{}:{}:{}: invalid YAML: {}", source, e.mark.line + 1,
                                  e.mark.column + 1, e.msg));
  }
}

DsConfig load_ds_config(const std::filesystem::path& file, int world_size) {
  const std::string source = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open the DeepSpeed config file", source));
  std::stringstream buf;
  buf << in.rdbuf();
  const auto ext = lower(file.extension().string());
  json j;
  if (ext == ".json") {
    j = parse_json_text(buf.str(), source);
  } else if (ext == ".yaml" || ext == ".yml") {
    j = yaml_text_to_json(buf.str(), source);
  } else {
    throw ConfigError(fmt::format(
        "{}: unknown config file extension \"{}\"; allowed: .json, .yaml, .yml", source, ext));
  }
  DsConfig cfg = parse_ds_config(j, source, world_size);
  for (const auto& w : cfg.warnings) spdlog::warn("{}", w);
  return cfg;
}

std::string ds_config_reference_markdown() {
  std::string md;
  md +=
      "# DeepSpeed configuration reference (dsactor)\n\n"
      "Generated from the key table in `trainer/config/ds_config.cpp` by "
      "`ds_config_reference_markdown()`.\n"
      "Do not edit by hand: `test_ds_config` fails when this file differs from the table.\n"
      "Regenerate with `DSACTOR_UPDATE_DOCS=1 build/tests/test_ds_config "
      "--gtest_filter='*ReferenceDoc*'`.\n\n"
      "Key names and defaults are DeepSpeed's. Rules beyond single keys:\n\n"
      "- Batch: `train_batch_size == train_micro_batch_size_per_gpu * "
      "gradient_accumulation_steps * world_size`. Any two give the third; only "
      "`train_batch_size` gives gradient_accumulation_steps 1 and micro = train_batch_size "
      "// world_size; only the micro batch gives gradient_accumulation_steps 1. Derived values "
      "use DeepSpeed's floor divisions and must still satisfy the rule.\n"
      "- Unknown keys, wrong types and out-of-range values are errors naming the file, the key "
      "path and what is allowed, with the nearest known key as a hint.\n"
      "- `\"auto\"` (the Hugging Face placeholder) is rejected: dsactor needs concrete values.\n"
      "- Integer keys accept JSON floats with an integral value (`2e8`).\n"
      "- `fp16.enabled` and `bf16.enabled` cannot both be true.\n"
      "- `device: nvme` needs `nvme_path`; `offload_optimizer.ratio` < 1 needs stage 3.\n"
      "- An alias and its canonical key cannot both be given; deprecated keys are accepted "
      "with a warning.\n"
      "- The parser does not refuse ZeRO stages or offload modes; the trainer decides at "
      "start-up what it can run.\n";

  std::vector<std::string_view> parents = {""};
  for (const auto& s : key_table())
    if (s.kind == Kind::kObject) parents.push_back(s.path);

  for (auto parent : parents) {
    const KeySpec* ps = parent.empty() ? nullptr : find_spec(parent);
    md += parent.empty() ? std::string("\n## Top level\n\n")
                         : fmt::format("\n## `{}`\n\n{}{}\n\n", parent, ps->doc,
                                       ps->nullable ? " May be null." : "");
    md += "| key | default | allowed | description |\n|---|---|---|---|\n";
    for (const auto& s : key_table()) {
      if (parent_of(s.path) != parent || !s.alias_of.empty()) continue;
      std::string doc(s.doc);
      if (s.kind == Kind::kObject) doc += fmt::format(" See `{}` below.", s.path);
      std::vector<std::string> aliases;
      for (const auto& a : key_table())
        if (a.alias_of == s.path)
          aliases.push_back(fmt::format("`{}`{}",
                                        parent_of(a.path) == parent ? leaf_of(a.path) : a.path,
                                        a.deprecated ? " (deprecated)" : ""));
      if (!aliases.empty()) doc += fmt::format(" Also spelled {}.", fmt::join(aliases, ", "));
      if (s.deprecated) doc += " Accepted with a warning.";
      md += fmt::format("| `{}` | {} | {} | {} |\n", leaf_of(s.path), default_text(s),
                        allowed_text(s), doc);
    }
  }
  return md;
}

}  // namespace dsactor::trainer
