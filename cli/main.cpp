#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <exception>

#include "cli/commands.h"
#include "cli/unknown_option.h"
#include "kernels/cpu/threads.h"
#include "trainer/config/ds_config.h"

int main(int argc, char** argv) {
  // Logs go to stderr so stdout carries only results (samples, --json objects).
  spdlog::set_default_logger(spdlog::stderr_color_mt("dsactor"));
  spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
  if (const char* level = std::getenv("DSACTOR_LOG"))
    spdlog::set_level(spdlog::level::from_str(level));

  CLI::App app{"dsactor: ZeRO-3 / ZeRO-Infinity training with every memory tier as a service"};
  app.require_subcommand(1);
  int threads = dsactor::kernels::cpu::openmp_default_threads();
  app.add_option("--threads", threads,
                 "threads for kernels and BLAS (same count + seed = same bits)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.parse_complete_callback([&] { dsactor::kernels::cpu::set_threads(threads); });
  dsactor::cli::add_train_command(app);
  dsactor::cli::add_eval_command(app);
  dsactor::cli::add_generate_command(app);
  dsactor::cli::add_export_command(app);
  dsactor::cli::add_tokenize_command(app);
  dsactor::cli::add_report_command(app);
  dsactor::cli::add_bench_command(app);
  dsactor::cli::add_start_command(app);
  dsactor::cli::add_up_command(app);
  dsactor::cli::add_status_command(app);
  dsactor::cli::add_launch_command(app);
  dsactor::cli::add_keygen_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    spdlog::error("{}", dsactor::cli::describe_unexpected_arguments(app));
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dsactor::trainer::ConfigError& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
