// `dsactor keygen` writes a usable pair and refuses to replace a secret key without --force.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "security/curve_keys.h"

namespace {

namespace fs = std::filesystem;

// Runs the command, returns (exit status, stdout + stderr).
std::pair<int, std::string> run(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(KeygenCli, WritesAPairAndKeepsAnExistingSecret) {
  const fs::path dir = fs::temp_directory_path() / ("dsactor-keygen-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string bin = DSACTOR_BINARY;
  auto [rc, out] = run(bin + " keygen --out " + dir.string() + " --name svc");
  ASSERT_EQ(rc, 0) << out;
  const auto keys = dsactor::security::read_secret_key_file(dir / "svc.key_secret");
  EXPECT_THAT(out, ::testing::HasSubstr("public key " + keys.public_key));
  EXPECT_EQ(dsactor::security::read_public_key_file(dir / "svc.key"), keys.public_key);
  auto [rc2, out2] = run(bin + " keygen --out " + dir.string() + " --name svc");
  EXPECT_NE(rc2, 0);
  EXPECT_THAT(out2, ::testing::HasSubstr("refusing to replace a secret key"));
  EXPECT_EQ(dsactor::security::read_secret_key_file(dir / "svc.key_secret").secret_key,
            keys.secret_key);
  auto [rc3, out3] = run(bin + " keygen --out " + dir.string() + " --name svc --force");
  EXPECT_EQ(rc3, 0) << out3;
  EXPECT_NE(dsactor::security::read_secret_key_file(dir / "svc.key_secret").secret_key,
            keys.secret_key);
  fs::remove_all(dir);
}

}  // namespace
