#pragma once
// What the `dsactor bench ... --json` tests share: one run's report through the binary, and
// the numbers in it.
#include <filesystem>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_test_util.h"

namespace dsactor::testing {

// The JSON report `dsactor <args>` prints (after any log lines), run in `workdir`; throws,
// failing the test with the command's stderr, when it does not exit 0.
inline nlohmann::json bench_report(const std::string& args, const std::filesystem::path& workdir) {
  const auto r = run_dsactor(args, workdir);
  if (r.exit_code != 0)
    throw std::runtime_error("dsactor " + args + " exited " + std::to_string(r.exit_code) + ":\n" +
                             r.err);
  return nlohmann::json::parse(r.out.substr(r.out.find('{')));
}

// The number under `key`; throws when there is none.
inline double number_at(const nlohmann::json& j, const char* key) {
  return j.at(key).get<double>();
}

}  // namespace dsactor::testing
