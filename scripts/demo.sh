#!/usr/bin/env bash
# The main job: install what is missing, build, and train the `small` GPT on the fortunes
# corpus in this process; prints a generated sample and where the checkpoint is.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
exec ./build/cli/dsactor train --config configs/ds_small_demo.json --model small \
  --data /usr/share/games/fortunes --seq 128 --out runs/demo "$@"
