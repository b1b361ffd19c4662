// The ds_config rules beyond single keys, DeepSpeed's: the batch triple and its floor
// divisions, the optimizer and scheduler sections, ZeRO's stage-dependent default and
// deprecated booleans (and the deprecated boolean section), and the combinations dsactor
// refuses.
#include <fmt/format.h>

#include <string>
#include <utility>

#include "key_table/key_path.h"
#include "key_table/key_spec.h"
#include "trainer/config/ds_config_keys.h"
#include "trainer/config/ds_config_parse.h"

namespace dsactor::trainer::ds_config_detail {
namespace {

const key_table::KeySpec& spec_of(std::string_view path) {
  return *ds_key_table().find(path);
}

void resolve_batch(ParseState& state) {
  auto& c = state.cfg;
  const bool tb = state.has("train_batch_size");
  const bool mb = state.has("train_micro_batch_size_per_gpu");
  const bool ga = state.has("gradient_accumulation_steps");
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
    state.fail(
        "train_batch_size",
        "missing: give train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed derives "
        "the others from train_batch_size = train_micro_batch_size_per_gpu * "
        "gradient_accumulation_steps * world_size)");
  }
  if (c.train_micro_batch_size_per_gpu < 1)
    state.fail("train_micro_batch_size_per_gpu",
               fmt::format("derived value is {} ({}); it must be >= 1",
                           c.train_micro_batch_size_per_gpu, derived));
  if (c.gradient_accumulation_steps < 1)
    state.fail("gradient_accumulation_steps",
               fmt::format("derived value is {} ({}); it must be >= 1",
                           c.gradient_accumulation_steps, derived));
  const int64_t product = c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * w;
  if (c.train_batch_size != product)
    state.fail(
        "train_batch_size",
        fmt::format("train_batch_size ({}) != train_micro_batch_size_per_gpu ({}) * "
                    "gradient_accumulation_steps ({}) * world_size ({}) = {}{}",
                    c.train_batch_size, c.train_micro_batch_size_per_gpu,
                    c.gradient_accumulation_steps, w, product,
                    derived.empty() ? std::string() : fmt::format(" (derived: {})", derived)));
}

// Keys of a section's params that the section's type does not take (DeepSpeed passes the
// params to the type's constructor as keyword arguments), and the required ones missing.
void check_params_of_type(ParseState& state, std::string_view params, size_t which,
                          const char* type_name) {
  const auto& table = ds_key_table();
  for (const auto* s : table.children(params))
    if (state.has(s->path) && !table.applies(*s, which))
      state.fail(s->path, table.not_applicable_problem(*s, which));
  for (const auto* s : table.children(params))
    if (table.applies(*s, which) && s->default_doc == "required" && !state.has(s->path))
      state.fail(s->path, fmt::format("missing: {} requires {} ({})", type_name,
                                      key_table::leaf_of(s->path), key_table::allowed_text(*s)));
}

void resolve_optimizer_and_scheduler(ParseState& state) {
  auto& c = state.cfg;
  c.optimizer.present = state.has("optimizer");
  if (c.optimizer.present && !state.has("optimizer.type"))
    state.fail("optimizer.type", "missing: an optimizer section needs a type; allowed: " +
                                     key_table::allowed_text(spec_of("optimizer.type")));
  if (c.optimizer.present)
    check_params_of_type(state, "optimizer.params", optimizer_index(c.optimizer.type),
                         to_string(c.optimizer.type));
  // DeepSpeed: "Optimizer name of Adam forces AdamW logic unless adam_w_mode is explicitly set"
  // and AdamW always means decoupled weight decay.
  if (c.optimizer.type == OptimizerType::kAdamW) c.optimizer.adam_w_mode = true;

  if (!state.has("scheduler")) {
    c.scheduler.type = SchedulerType::kNone;
    return;
  }
  if (!state.has("scheduler.type"))
    state.fail("scheduler.type", "missing: a scheduler section needs a type; allowed: " +
                                     key_table::allowed_text(spec_of("scheduler.type")));
  check_params_of_type(state, "scheduler.params", scheduler_index(c.scheduler.type),
                       to_string(c.scheduler.type));
}

// deepspeed/runtime/zero/config.py, read_zero_config_deprecated: "zero_optimization": true
// is stage 1 with allgather_bucket_size from the top-level allgather_size, false is stage 0
// (DeepSpeed warns that the form is deprecated; so do we).
void resolve_zero_flag(ParseState& state) {
  if (!state.zero_optimization_flag) return;
  auto& c = state.cfg;
  c.zero_optimization.stage = *state.zero_optimization_flag ? 1 : 0;
  if (c.zero_optimization.stage > 0) c.zero_optimization.allgather_bucket_size = c.allgather_size;
  c.warnings.push_back(fmt::format(
      "{}: \"zero_optimization\": {} is DeepSpeed's deprecated form of {{\"stage\": {}}}; use "
      "the object form",
      state.source, *state.zero_optimization_flag, c.zero_optimization.stage));
}

void resolve_zero(ParseState& state) {
  resolve_zero_flag(state);
  auto& z = state.cfg.zero_optimization;
  if (!state.has("zero_optimization.overlap_comm")) z.overlap_comm = z.stage == 3;

  // Deprecated booleans, mapped the way DeepSpeed's new_param_fn does.
  auto flag = [&](const char* path) {
    auto it = state.given.find(path);
    return it != state.given.end() && std::holds_alternative<bool>(it->second) &&
           std::get<bool>(it->second);
  };
  const bool pin = flag("zero_optimization.cpu_offload_use_pin_memory");
  auto map_cpu_offload = [&](std::string_view old_key, std::string_view section,
                             OffloadDevice& device, bool& pin_memory) {
    if (!flag(std::string(old_key).c_str())) return;
    if (state.has(section))
      state.fail(old_key, fmt::format("deprecated key given together with its replacement {}; "
                                      "keep only {}",
                                      section, key_table::leaf_of(section)));
    device = OffloadDevice::kCpu;
    pin_memory = pin;
  };
  map_cpu_offload("zero_optimization.cpu_offload", "zero_optimization.offload_optimizer",
                  z.offload_optimizer.device, z.offload_optimizer.pin_memory);
  map_cpu_offload("zero_optimization.cpu_offload_param", "zero_optimization.offload_param",
                  z.offload_param.device, z.offload_param.pin_memory);

  if (z.offload_param.device == OffloadDevice::kNvme && z.offload_param.nvme_path.empty())
    state.fail(
        "zero_optimization.offload_param.nvme_path",
        "missing: offload_param.device is \"nvme\", which needs nvme_path (a directory on the "
        "NVMe device)");
  if (z.offload_optimizer.device == OffloadDevice::kNvme && z.offload_optimizer.nvme_path.empty())
    state.fail(
        "zero_optimization.offload_optimizer.nvme_path",
        "missing: offload_optimizer.device is \"nvme\", which needs nvme_path (a directory on "
        "the NVMe device)");
  if (z.offload_optimizer.enabled() && z.offload_optimizer.ratio < 1.0 && z.stage != 3)
    state.fail(
        "zero_optimization.offload_optimizer.ratio",
        fmt::format("value {} (partial offload) is only allowed with zero_optimization.stage 3, "
                    "stage is {}",
                    z.offload_optimizer.ratio, z.stage));
  // Keys only offload services act on: given without them, they would do nothing.
  for (const auto& [key, why] :
       {std::pair{"update_publication", "no offload service answers commits"},
        std::pair{"arena_checksums", "no payload goes through an arena"}}) {
    const std::string path = fmt::format("zero_optimization.offload_optimizer.{}", key);
    if (!z.offload_optimizer.enabled() && state.has(path))
      state.cfg.warnings.push_back(
          fmt::format("{}: {} has no effect: offload_optimizer.device is \"none\", so {}",
                      state.source, path, why));
  }
  if (z.offload_optimizer.update_at_push) {
    // The update runs before the step's verdict: only where nothing in the verdict can
    // change it.
    const std::string key = "zero_optimization.offload_optimizer.update_at_push";
    auto refuse = [&](const std::string& why) {
      state.fail(key, "true needs " + why +
                          " (each partition's Adam step runs as its gradient "
                          "is pushed, before the step's global norm and overflow check are known)");
    };
    if (!z.offload_optimizer.enabled())
      refuse(
          "offload_optimizer.device \"cpu\" (it is \"none\": no offload service runs the "
          "optimizer)");
    else if (z.offload_optimizer.device == OffloadDevice::kNvme)
      refuse(
          "offload_optimizer.device \"cpu\" (it is \"nvme\": a partition on NVMe is updated "
          "in one stream at the commit)");
    else if (state.cfg.gradient_clipping > 0)
      refuse(fmt::format("gradient_clipping 0 (it is {}: the clip needs the global norm)",
                         state.cfg.gradient_clipping));
    else if (state.cfg.fp16.enabled || state.cfg.bf16.enabled)
      refuse(
          fmt::format("fp32 training ({} is enabled: its loss scale or overflow check decides "
                      "the step after the backward)",
                      state.cfg.fp16.enabled ? "fp16" : "bf16"));
    else if (z.offload_optimizer.delayed_parameter_update)
      refuse("delayed_parameter_update false (that runs the update behind the next step)");
  }
  z.zeropp_loco_param.present = state.has("zero_optimization.zeropp_loco_param");
}

void resolve_rest(ParseState& state) {
  auto& c = state.cfg;
  if (c.fp16.enabled && c.bf16.enabled)
    state.fail("fp16.enabled",
               "fp16.enabled and bf16.enabled are both true; enable at most one of them");
}

}  // namespace

void apply_rules(ParseState& state) {
  resolve_batch(state);
  resolve_optimizer_and_scheduler(state);
  resolve_zero(state);
  resolve_rest(state);
}

}  // namespace dsactor::trainer::ds_config_detail
