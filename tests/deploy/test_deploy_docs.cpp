// docs/deploy.md is generated from the deployment key table; it may never drift from the
// parser. DSACTOR_UPDATE_DOCS=1 rewrites it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "deploy/deploy_config.h"

TEST(DeployDocs, CommittedReferenceEqualsTheKeyTable) {
  const std::string path = std::string(DSACTOR_SOURCE_DIR) + "/docs/deploy.md";
  const std::string generated = dsactor::deploy::deploy_reference_markdown();
  if (std::getenv("DSACTOR_UPDATE_DOCS")) std::ofstream(path) << generated;
  std::ifstream in(path);
  std::stringstream committed;
  committed << in.rdbuf();
  EXPECT_EQ(committed.str(), generated) << path << " is stale: rerun with DSACTOR_UPDATE_DOCS=1";
}
