// libFuzzer target for the deployment file's reader (deploy/deploy_config.h): any text must
// give a DeployConfig or a DeployConfigError (yaml-cpp's own exceptions included, wrapped),
// never crash, hang, leak, trip UBSan or throw anything else; every role of a file that loads
// has a command line, with and without its key files resolved.

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "deploy/deploy_config.h"

namespace {

[[noreturn]] void die(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fuzz_deploy_yaml invariant broken: %s %s\n", what, detail);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  dsactor::deploy::DeployConfig cfg;
  try {
    // As if the file were in configs/: relative ds_config names find the shipped ones, so
    // the parse goes past them. The parser only reads (stat) and never writes.
    cfg = dsactor::deploy::parse_deploy_config(text, DSACTOR_FUZZ_CONFIGS "/fuzz.yaml");
  } catch (const dsactor::deploy::DeployConfigError& e) {
    if (std::string(e.what()).empty()) die("error without a message");
    return 0;
  } catch (const std::exception& e) {
    die("escaped exception:", e.what());
  }
  if (cfg.roles.empty()) die("a deployment without roles loaded");
  for (const auto& r : cfg.roles)
    if (dsactor::deploy::to_command_line(cfg, r).size() < 3) die("short command line");
  if (!cfg.security.insecure) {
    dsactor::deploy::resolve_key_files(cfg, "/nonexistent-fuzz/keys");
    for (const auto& r : cfg.roles) (void)dsactor::deploy::to_command_line(cfg, r);
  }
  return 0;
}
