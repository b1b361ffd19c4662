#pragma once
// The seed inputs of the security-side fuzz targets (fuzz_rendezvous, fuzz_key_files,
// fuzz_deploy_yaml): valid inputs of every kind each target reads, made by our own encoders
// and key writers so they follow the formats as they change. make_seeds writes them for a
// libFuzzer run; seed_replay.cpp feeds them to the targets in the normal test suite.
#include <string>
#include <vector>

namespace dsactor::fuzz {

// Every request kind, encoded, in the layout of fuzz_input.h (each with and without the
// tight-limits bit).
std::vector<std::string> rendezvous_seeds();
// A secret certificate, a public one, a bare key, an allow-list, a job token file.
std::vector<std::string> key_file_seeds();
// Deployment files with a `security:` block (keys, token, coordinator key; insecure). The
// shipped configs/*.yaml are seeds too (read by the caller).
std::vector<std::string> deploy_yaml_seeds();

}  // namespace dsactor::fuzz
