// Writes the seed corpus of one of the security-side fuzz targets (fuzz_seeds.h):
//   make_seeds fuzz_rendezvous|fuzz_deploy_yaml|fuzz_key_files <corpus dir>
// (fuzz_deploy_yaml also gets configs/*.yaml, copied by run_fuzz.sh.)

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_seeds.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s fuzz_rendezvous|fuzz_deploy_yaml|fuzz_key_files <dir>\n",
                 argv[0]);
    return 2;
  }
  const std::string target = argv[1];
  const fs::path dir = argv[2];
  std::vector<std::string> seeds;
  if (target == "fuzz_rendezvous")
    seeds = dsactor::fuzz::rendezvous_seeds();
  else if (target == "fuzz_key_files")
    seeds = dsactor::fuzz::key_file_seeds();
  else if (target == "fuzz_deploy_yaml")
    seeds = dsactor::fuzz::deploy_yaml_seeds();
  else
    return 2;
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream out(dir / ("seed-" + std::to_string(i)), std::ios::binary);
    out << seeds[i];
    if (!out) {
      std::perror("make_seeds: write");
      return 1;
    }
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}
