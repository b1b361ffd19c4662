#include "trainer/monitor/flops_profiler.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

namespace dsactor::trainer {
namespace {

// ---- DeepSpeed's number words (number_to_string and friends: 2 decimals, then %g) ----

std::string number_text(double num) {
  struct Unit {
    double magnitude;
    const char* name;
  };
  static constexpr Unit kUnits[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "K"}};
  Unit u{1.0, ""};
  bool found = false;
  for (const auto& c : kUnits)
    if (num >= c.magnitude) {
      u = c;
      found = true;
      break;
    }
  if (!found && num < 1 && num != 0) u = num >= 1e-3 ? Unit{1e-3, "m"} : Unit{1e-6, "u"};
  return fmt::format("{:g} {}", std::round(num / u.magnitude * 100.0) / 100.0, u.name);
}

std::string params_text(double n) {
  std::string s = number_text(n);
  std::replace(s.begin(), s.end(), 'G', 'B');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}
std::string macs_text(double n) {
  return number_text(n) + "MACs";
}
std::string flops_text(double n) {
  return number_text(n) + "FLOPS";
}
std::string duration_text(double s) {
  return number_text(s) + "s";
}

double percent(double part, double whole) {
  return whole > 0 ? std::round(100.0 * part / whole * 100.0) / 100.0 : 0.0;
}

// ---- the tree: DeepSpeed's counting rules on dsactor's modules ----

ModuleProfile leaf(std::string name, std::string type, int64_t params, double macs, double flops,
                   double seconds) {
  return {std::move(name), std::move(type), params, macs, flops, seconds, {}};
}

ModuleProfile parent(std::string name, std::string type, std::vector<ModuleProfile> children,
                     double own_flops, std::optional<double> seconds) {
  ModuleProfile m{std::move(name), std::move(type), 0, 0, own_flops, 0, std::move(children)};
  double children_seconds = 0;
  for (const auto& c : m.children) {
    m.params += c.params;
    m.macs += c.macs;
    m.flops += c.flops;
    children_seconds += c.seconds;
  }
  m.seconds = seconds.value_or(children_seconds);
  return m;
}

}  // namespace

ModuleProfile gpt_module_profile(const GptConfig& g, const ForwardProfile& f) {
  const double B = f.B, T = f.T, C = g.n_embd, V = g.vocab_size, NH = g.n_head;
  const double BT = B * T;
  const auto cc = static_cast<int64_t>(g.n_embd);
  const auto vc = static_cast<int64_t>(g.vocab_size) * cc;
  auto layernorm = [&](const char* name, double seconds) {
    return leaf(name, "LayerNorm", 2 * cc, 0, 5 * BT * C, seconds);
  };
  std::vector<ModuleProfile> blocks;
  for (int l = 0; l < g.n_layer; ++l) {
    const LayerTimes& t = f.layers.at(static_cast<size_t>(l));
    // c_attn (C -> 3C), Q K^T and att V (T x T per head), c_proj (C -> C); softmax and the
    // 1/sqrt(hs) scaling one FLOP per score.
    const double attn_macs = BT * C * 3 * C + 2 * B * T * T * C + BT * C * C;
    const double scores = B * NH * T * T;
    ModuleProfile attn = leaf("attn", "Attention", 4 * cc * cc + 4 * cc, attn_macs,
                              2 * attn_macs + 2 * scores, t.attn);
    // c_fc (C -> 4C), GELU, c_proj (4C -> C).
    const double mlp_macs = 8 * BT * C * C;
    ModuleProfile mlp =
        leaf("mlp", "MLP", 8 * cc * cc + 5 * cc, mlp_macs, 2 * mlp_macs + 4 * BT * C, t.mlp);
    // The two residual adds are the block's own FLOPs (its forward, not a submodule's).
    blocks.push_back(parent(
        std::to_string(l), "Block",
        {layernorm("ln_1", t.ln_1), std::move(attn), layernorm("ln_2", t.ln_2), std::move(mlp)},
        2 * BT * C, t.ln_1 + t.attn + t.ln_2 + t.mlp));
  }
  std::vector<ModuleProfile> top;
  // Token and position lookups (0 FLOPs) and their sum.
  top.push_back(
      leaf("embedding", "Embedding", vc + int64_t{g.block_size} * cc, 0, BT * C, f.embedding));
  top.push_back(parent("h", "ModuleList", std::move(blocks), 0, std::nullopt));
  top.push_back(layernorm("ln_f", f.ln_f));
  // Tied to the embedding: the same parameters, counted once in the model's total.
  top.push_back(leaf("lm_head", "Linear", vc, BT * C * V, 2 * BT * C * V, f.lm_head));
  ModuleProfile model = parent("", "GPT", std::move(top), 0, f.total);
  model.params -= vc;
  return model;
}

namespace {

std::string module_line(const ModuleProfile& m, const ModuleProfile& total) {
  return fmt::format("{} = {:g}% Params, {} = {:g}% MACs, {} = {:g}% latency, {}",
                     params_text(static_cast<double>(m.params)),
                     percent(static_cast<double>(m.params), static_cast<double>(total.params)),
                     macs_text(m.macs), percent(m.macs, total.macs), duration_text(m.seconds),
                     percent(m.seconds, total.seconds),
                     flops_text(m.seconds > 0 ? std::round(m.flops / m.seconds * 100) / 100 : 0));
}

// A PyTorch repr: "(name): Type(profile)" for a leaf, its children indented inside.
void tree_text(const ModuleProfile& m, const ModuleProfile& total, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  const std::string head = m.name.empty() ? m.type : fmt::format("({}): {}", m.name, m.type);
  if (m.children.empty()) {
    out += fmt::format("{}{}({})\n", pad, head, module_line(m, total));
    return;
  }
  out += fmt::format("{}{}(\n{}  {},\n", pad, head, pad, module_line(m, total));
  for (const auto& c : m.children) tree_text(c, total, indent + 2, out);
  out += pad + ")\n";
}

struct Totals {
  double macs = 0, params = 0, seconds = 0;
};

void walk(const ModuleProfile& m, size_t depth, std::vector<std::map<std::string, Totals>>& info) {
  if (info.size() <= depth) info.resize(depth + 1);
  auto& t = info[depth][m.type];
  t.macs += m.macs;
  t.params += static_cast<double>(m.params);
  t.seconds += m.seconds;
  for (const auto& c : m.children) walk(c, depth + 1, info);
}

// print_model_aggregated_profile: per depth, the top modules (by type) in params, MACs and
// latency, as Python dicts. Like DeepSpeed, depth -1 lists depths 0 .. deepest - 1.
std::string aggregated_text(const ModuleProfile& model, int64_t module_depth, int64_t top_modules) {
  std::vector<std::map<std::string, Totals>> info;
  walk(model, 0, info);
  const size_t depth = module_depth < 0 ? info.size() - 1 : static_cast<size_t>(module_depth);
  std::string out = fmt::format(
      "Top {} modules in terms of params, MACs or fwd latency at different model depths:\n",
      top_modules);
  for (size_t d = 0; d < depth && d < info.size(); ++d) {
    auto top = [&](double Totals::*key, std::string (*text)(double)) {
      std::vector<std::pair<std::string, Totals>> v(info[d].begin(), info[d].end());
      std::stable_sort(v.begin(), v.end(),
                       [&](const auto& a, const auto& b) { return a.second.*key > b.second.*key; });
      std::string dict;
      for (size_t i = 0; i < v.size() && i < static_cast<size_t>(top_modules); ++i)
        dict += fmt::format("{}'{}': '{}'", i ? ", " : "", v[i].first, text(v[i].second.*key));
      return "{" + dict + "}";
    };
    out += fmt::format(
        "depth {}:\n    params      - {}\n    MACs        - {}\n"
        "    fwd latency - {}\n",
        d, top(&Totals::params, params_text), top(&Totals::macs, macs_text),
        top(&Totals::seconds, duration_text));
  }
  return out;
}

std::string summary_line(const std::string& label, const std::string& value) {
  return fmt::format("{:<70}  {:<8}\n", label, value);
}

}  // namespace

std::string flops_profile_text(const ModuleProfile& m, const ProfileContext& ctx,
                               const FlopsProfilerConfig& o, double recompute_fwd_factor) {
  const double fwd = m.seconds, bwd = ctx.bwd_seconds, step = ctx.step_seconds;
  const double bwd_factor = 2 + recompute_fwd_factor;
  const double iter = fwd + bwd + step;
  const auto per = [](double flops, double s) { return flops_text(s > 0 ? flops / s : 0); };
  std::string t =
      "\n-------------------------- DeepSpeed Flops Profiler --------------------------\n";
  t += fmt::format("Profile Summary at step {}:\n", ctx.profile_step);
  t += "Notations:\n"
       "data parallel size (dp_size), model parallel size(mp_size),\n"
       "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
       "number of floating-point operations (flops), floating-point operations per second "
       "(FLOPS),\n"
       "fwd latency (forward propagation latency), bwd latency (backward propagation latency),\n"
       "step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n\n";
  t += summary_line("world size: ", std::to_string(ctx.world_size));
  t += summary_line("data parallel size: ", std::to_string(ctx.world_size));
  t += summary_line("model parallel size: ", "1");
  t += summary_line("batch size per GPU: ", std::to_string(ctx.micro_batch));
  t += summary_line("params per GPU: ", params_text(static_cast<double>(m.params)));
  t += summary_line("params of model = params per GPU * mp_size: ",
                    params_text(static_cast<double>(m.params)));
  t += summary_line("fwd MACs per GPU: ", macs_text(m.macs));
  t += summary_line("fwd flops per GPU: ", number_text(m.flops));
  t += summary_line("fwd flops of model = fwd flops per GPU * mp_size: ", number_text(m.flops));
  t += summary_line("fwd latency: ", duration_text(fwd));
  t += summary_line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", per(m.flops, fwd));
  t += summary_line("bwd latency: ", duration_text(bwd));
  t += summary_line(
      fmt::format("bwd FLOPS per GPU = {:g} * fwd flops per GPU / bwd latency: ", bwd_factor),
      per(bwd_factor * m.flops, bwd));
  t += summary_line(
      fmt::format("fwd+bwd FLOPS per GPU = {:g} * fwd flops per GPU / (fwd+bwd latency): ",
                  bwd_factor + 1),
      per((bwd_factor + 1) * m.flops, fwd + bwd));
  t += summary_line("step latency: ", duration_text(step));
  t += summary_line("iter latency: ", duration_text(iter));
  t += summary_line(
      fmt::format("FLOPS per GPU = {:g} * fwd flops per GPU / iter latency: ", bwd_factor + 1),
      per((bwd_factor + 1) * m.flops, iter));
  t += summary_line(
      "samples/second: ",
      fmt::format(
          "{:g}",
          iter > 0
              ? std::round(static_cast<double>(ctx.micro_batch * ctx.world_size) / iter * 100) / 100
              : 0.0));
  t += "\n----------------------------- Aggregated Profile per GPU -----------------------------\n";
  t += aggregated_text(m, o.module_depth, o.top_modules);
  if (o.detailed) {
    t +=
        "\n------------------------------ Detailed Profile per GPU ------------------------------\n"
        "Each module profile is listed after its name in the following order: \n"
        "params, percentage of total params, MACs, percentage of total MACs, fwd latency, "
        "percentage of total fwd latency, fwd FLOPS\n\n";
    tree_text(m, m, 0, t);
  }
  t += "------------------------------------------------------------------------------\n";
  return t;
}

FlopsProfiler::FlopsProfiler(const DsConfig& config, const GptConfig& model)
    : config_(config), model_(model) {}

ForwardProfile* FlopsProfiler::before_step(int64_t completed_steps) {
  if (!config_.flops_profiler.enabled || completed_steps != config_.flops_profiler.profile_step)
    return nullptr;
  current_.emplace();
  return &*current_;
}

std::optional<std::string> FlopsProfiler::after_step(const StepResult& r) {
  if (!current_) return std::nullopt;
  const ForwardProfile forward = *current_;
  current_.reset();
  if (!forward.recorded) return std::nullopt;
  const ModuleProfile tree = gpt_module_profile(model_, forward);
  const auto gas = static_cast<double>(std::max<int64_t>(1, config_.gradient_accumulation_steps));
  const ProfileContext ctx{config_.flops_profiler.profile_step, config_.world_size,
                           config_.train_micro_batch_size_per_gpu, r.backward_seconds / gas,
                           r.optimizer_seconds};
  std::string text = flops_profile_text(tree, ctx, config_.flops_profiler,
                                        config_.flops_profiler.recompute_fwd_factor);
  const auto& file = config_.flops_profiler.output_file;
  if (file && !file->empty()) {
    const std::filesystem::path p(*file);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    spdlog::info("flops profiler: the profile of step {} is in {}", ctx.profile_step, p.string());
  } else {
    spdlog::info("{}", text);
  }
  return text;
}

}  // namespace dsactor::trainer
