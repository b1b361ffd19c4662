#!/usr/bin/env bash
# Configures and builds dsactor. Default: Release into ./build, every target.
#   scripts/build.sh                   Release build in build/
#   scripts/build.sh --sanitize        RelWithDebInfo + ASan/UBSan in build-asan/ (the test configuration)
#   scripts/build.sh --target dsactor  only that target and what it needs (repeatable); the
#                                      same configuration, so a later full build reuses it
# Other arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build
args=(-DCMAKE_BUILD_TYPE=Release)
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize)
      dir=build-asan
      args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSACTOR_SANITIZE=ON "${args[@]:1}")
      shift ;;
    --target)
      targets+=(--target "$2")
      shift 2 ;;
    *)
      args+=("$1")
      shift ;;
  esac
done
cmake -S . -B "$dir" -G Ninja "${args[@]}" >/dev/null
cmake --build "$dir" -j "$(nproc)" "${targets[@]}"
