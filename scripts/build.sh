#!/usr/bin/env bash
# Configures and builds dsactor. Default: Release into ./build.
#   scripts/build.sh               Release build in build/
#   scripts/build.sh --sanitize    RelWithDebInfo + ASan/UBSan in build-asan/ (the test configuration)
# Further arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build
args=(-DCMAKE_BUILD_TYPE=Release)
if [ "${1:-}" = "--sanitize" ]; then
  shift
  dir=build-asan
  args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSACTOR_SANITIZE=ON)
fi
cmake -S . -B "$dir" -G Ninja "${args[@]}" "$@" >/dev/null
cmake --build "$dir" -j "$(nproc)"
