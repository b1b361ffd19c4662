#include <fmt/format.h>

#include <memory>

#include "bench/train_bench.h"
#include "cli/commands.h"

namespace dsactor::cli {
namespace {

void print_result(const nlohmann::json& j, bool json) {
  if (json) {
    fmt::print("{}\n", j.dump());
    return;
  }
  for (const auto& [k, v] : j.items()) fmt::print("{:28} {}\n", k, v.dump());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "benchmarks; figures are printed beside a reference measured in the same run");
  bench->require_subcommand(1);

  auto* train = bench->add_subcommand("train", "stage-0 training step speed against the sgemm rate");
  auto o = std::make_shared<bench::TrainBenchOptions>();
  auto json = std::make_shared<bool>(false);
  train->add_option("--model", o->model, "model preset or YAML")->capture_default_str();
  train->add_option("--micro-batch", o->micro_batch, "B")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--seq", o->seq, "T")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--steps", o->steps, "measured steps")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--warmup", o->warmup_steps, "unmeasured steps first")->capture_default_str();
  train->add_flag("--json", *json, "print one JSON object");
  train->callback([o, json] { print_result(bench::run_train_bench(*o), *json); });
}

}  // namespace dsactor::cli
