#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with ctest.
#   scripts/test.sh              the suite on the Release build (what CI runs)
#   scripts/test.sh --sanitize   the suite under ASan + UBSan (build-asan/; the fuzz test
#                                is left out: it is already an ASan/UBSan build of its own)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# One test process at a time: each one already uses every core (OpenMP + OpenBLAS),
# and two of them would turn every parallel region into a wait for a scheduler quantum.
if [ "${1:-}" = "--sanitize" ]; then
  ./scripts/build.sh --sanitize
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -LE fuzz
else
  ./scripts/build.sh
  ctest --test-dir build --output-on-failure
fi
