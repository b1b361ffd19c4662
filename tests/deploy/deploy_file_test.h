#pragma once
// A fixture for tests of deploy files: a temp directory with a small ds_config (ds.json),
// and a deploy file written there and loaded, or its error.
#include <gtest/gtest.h>

#include <string>

#include "deploy/deploy_config.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::deploy {

class DeployFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_file(dir / "ds.json", R"({"train_micro_batch_size_per_gpu": 4})");
  }
  DeployConfig load(const std::string& yaml) {
    testing::write_file(dir / "deploy.yaml", yaml);
    return load_deploy_config(dir / "deploy.yaml");
  }
  // The error loading `yaml` gives; a test failure when it loads.
  std::string error_of(const std::string& yaml) {
    try {
      load(yaml);
    } catch (const DeployConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error for:\n" << yaml;
    return "";
  }
  std::string file() const { return (dir / "deploy.yaml").string(); }

  testing::TempDir dir;
};

}  // namespace dsactor::deploy
