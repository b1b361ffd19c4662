#pragma once
// DeepSpeed's flops profiler (deepspeed/profiling/flops_profiler/profiler.py) for dsactor's
// GPT: at flops_profiler.profile_step, the forward of one micro-batch is timed module by
// module, and a profile with DeepSpeed's layout goes to output_file or the log: a summary
// (params, MACs, FLOPs, fwd/bwd/step latency, FLOPS), the top modules per depth, and the
// module tree with each module's params, MACs and latency and their shares. MACs and FLOPs
// are counted analytically with DeepSpeed's rules (a linear layer 2 FLOPs per MAC, a
// LayerNorm 5 FLOPs per element, GELU, softmax, scaling and residual adds 1, embedding
// lookups 0).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config/ds_config.h"
#include "trainer/engine/engine.h"
#include "trainer/model/forward_profile.h"
#include "trainer/model/gpt_config.h"

namespace dsactor::trainer {

// One module of the profile tree, named and typed as in a PyTorch repr ("(attn): Attention").
struct ModuleProfile {
  std::string name, type;
  int64_t params = 0;          // its own and its children's
  double macs = 0, flops = 0;  // its children's included
  double seconds = 0;          // measured; for a container (ModuleList): its children's sum
  std::vector<ModuleProfile> children;
};

// The model's tree for one forward of `forward.B` x `forward.T` tokens: GPT > embedding,
// h (ModuleList) > Block > ln_1, attn, ln_2, mlp; ln_f; lm_head (tied to the embedding).
ModuleProfile gpt_module_profile(const GptConfig& model, const ForwardProfile& forward);

// What the summary says beside the tree.
struct ProfileContext {
  int64_t profile_step = 0;
  int world_size = 1;
  int64_t micro_batch = 0;
  double bwd_seconds = 0;   // of one micro-batch
  double step_seconds = 0;  // the optimizer step
};

// The whole profile text, DeepSpeed's layout, with its depth and top-module options.
std::string flops_profile_text(const ModuleProfile& model, const ProfileContext& context,
                               const FlopsProfilerConfig& options, double recompute_fwd_factor);

// When to profile and where the text goes, for one rank's run (DeepSpeed profiles on rank 0).
class FlopsProfiler {
 public:
  FlopsProfiler(const DsConfig& config, const GptConfig& model);
  // The profile the model should fill in the step that follows `completed_steps` steps;
  // null when that step is not the profiled one (DeepSpeed profiles while global_steps ==
  // profile_step, i.e. in step profile_step + 1).
  ForwardProfile* before_step(int64_t completed_steps);
  // After that step: writes the profile (output_file, else the log) and returns it.
  std::optional<std::string> after_step(const StepResult& result);

 private:
  DsConfig config_;
  GptConfig model_;
  std::optional<ForwardProfile> current_;
};

}  // namespace dsactor::trainer
