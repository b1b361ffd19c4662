// The security-side fuzz targets (fuzz_rendezvous, fuzz_key_files, fuzz_deploy_yaml) in the
// normal test suite: their seed corpus (fuzz_seeds.h, plus configs/*.yaml for the deploy
// reader) replayed through each target's entry point, compiled here without libFuzzer, so a
// target that stops building or an invariant a seed breaks (the target aborts) fails here;
// and each seed is checked to reach the code it was made for (a request that parses, keys
// that read, a deployment that loads), so the corpus keeps covering what it should.
// Fuzzing itself: -DDSACTOR_FUZZ=ON (clang), or tests/fuzz/run_fuzz.sh.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "actors/collectives/job_token.h"
#include "actors/collectives/rendezvous_protocol.h"
#include "deploy/deploy_config.h"
#include "security/curve_keys.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_seeds.h"

// The targets' LLVMFuzzerTestOneInput, renamed for this build (tests/fuzz/CMakeLists.txt).
extern "C" int fuzz_rendezvous_one_input(const uint8_t* data, size_t size);
extern "C" int fuzz_key_files_one_input(const uint8_t* data, size_t size);
extern "C" int fuzz_deploy_yaml_one_input(const uint8_t* data, size_t size);

namespace dsactor::fuzz {
namespace {

namespace fs = std::filesystem;

const uint8_t* bytes(const std::string& s) {
  return reinterpret_cast<const uint8_t*>(s.data());
}

TEST(FuzzSeedReplay, RendezvousSeedsParseAndRunThroughTheTarget) {
  const auto seeds = rendezvous_seeds();
  ASSERT_GE(seeds.size(), 12u);  // six request kinds, each with and without tight limits
  for (const auto& s : seeds) {
    const auto frames = split_frames(bytes(s), s.size(), 16);
    const auto parsed = actors::rendezvous::parse_request(frames);
    EXPECT_TRUE(parsed.request) << parsed.error;
    EXPECT_EQ(fuzz_rendezvous_one_input(bytes(s), s.size()), 0);
  }
  // Inputs that are no request at all are refused, not crashed on.
  for (const std::string& junk : {std::string(), std::string(1, '\x0f'), std::string(300, '\xff')})
    EXPECT_EQ(fuzz_rendezvous_one_input(bytes(junk), junk.size()), 0);
}

TEST(FuzzSeedReplay, KeyFileSeedsReadAndRunThroughTheTarget) {
  const auto seeds = key_file_seeds();
  ASSERT_EQ(seeds.size(), 5u);
  const fs::path dir = fs::path(::testing::TempDir()) / "fuzz-key-seeds";
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::owner_all);
  auto file_of = [&](const std::string& text) {
    const fs::path p = dir / "seed";
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
    fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write);
    return p;
  };
  EXPECT_NO_THROW(security::read_secret_key_file(file_of(seeds[0])));
  EXPECT_NO_THROW(security::read_public_key_file(file_of(seeds[1])));
  EXPECT_NO_THROW(security::read_public_key_file(file_of(seeds[2])));
  EXPECT_EQ(security::read_authorized_keys(file_of(seeds[3])).size(), 2u);
  EXPECT_TRUE(actors::is_job_token(actors::read_job_token_file(file_of(seeds[4]))));
  for (const auto& s : seeds) EXPECT_EQ(fuzz_key_files_one_input(bytes(s), s.size()), 0);
  fs::remove_all(dir);
}

TEST(FuzzSeedReplay, DeployYamlSeedsLoadAndRunThroughTheTarget) {
  std::vector<std::string> seeds = deploy_yaml_seeds();
  for (const auto& seed : seeds)
    EXPECT_NO_THROW(deploy::parse_deploy_config(seed, DSACTOR_FUZZ_CONFIGS "/fuzz.yaml")) << seed;
  size_t shipped = 0;
  for (const auto& e : fs::directory_iterator(DSACTOR_FUZZ_CONFIGS)) {
    if (e.path().extension() != ".yaml") continue;
    std::ostringstream text;
    text << std::ifstream(e.path(), std::ios::binary).rdbuf();
    seeds.push_back(text.str());
    ++shipped;
  }
  EXPECT_GE(shipped, 4u);
  for (const auto& s : seeds) EXPECT_EQ(fuzz_deploy_yaml_one_input(bytes(s), s.size()), 0);
}

}  // namespace
}  // namespace dsactor::fuzz
