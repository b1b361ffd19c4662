#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
# One test process at a time: each one already uses every core (OpenMP + OpenBLAS),
# and two of them would turn every parallel region into a wait for a scheduler quantum.
ctest --test-dir build --output-on-failure
