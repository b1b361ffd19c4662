#pragma once
// The tiny ZeRO-3 + offload run the metrics end-to-end tests watch: `dir`/corpus.txt (300
// numbered copies of `line`) and `dir`/ds.json, whose CSV monitor writes its losses under
// `dir`/monitor/`monitor_job`/.

#include <filesystem>
#include <string>

#include "tests/deploy/deploy_test_util.h"

namespace dsactor::testing {

inline void write_tiny_offload_run(const std::filesystem::path& dir, const std::string& line,
                                   const std::string& monitor_job) {
  std::string corpus;
  for (int i = 0; i < 300; ++i) corpus += line + " " + std::to_string(i) + "\n";
  write_file(dir / "corpus.txt", corpus);
  write_file(dir / "ds.json", R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                          "offload_param": {"device": "cpu"}},
    "csv_monitor": {"enabled": true, "output_path": ")" +
                                  (dir / "monitor").string() + R"(", "job_name": ")" + monitor_job +
                                  R"("}})");
}

}  // namespace dsactor::testing
