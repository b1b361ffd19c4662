#pragma once
#include <CLI/CLI.hpp>

namespace dsactor::cli {

// Each registers one subcommand (with its --help) and its callback on the app.
void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_export_command(CLI::App& app);
// `dsactor tokenize --tokenizer T --in TEXT... --out tokens.bin`: llm.c token files.
void add_tokenize_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_bench_command(CLI::App& app);
// `dsactor start --role offload|trainer|coordinator`: one role of a deployment, by hand.
void add_start_command(CLI::App& app);
// `dsactor up deploy.yaml`: every role of a deployment as child processes of this one.
void add_up_command(CLI::App& app);
void add_status_command(CLI::App& app);
// `dsactor launch --hostfile F -- ARGS`: `start --role trainer ARGS` on every hostfile slot.
void add_launch_command(CLI::App& app);
// `dsactor keygen --out DIR`: a CurveZMQ keypair in CZMQ's certificate files.
void add_keygen_command(CLI::App& app);

// The exit code of every subcommand for invalid arguments or an invalid config file.
constexpr int kExitConfig = 2;

}  // namespace dsactor::cli
