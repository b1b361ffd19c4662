#!/usr/bin/env bash
# The main job: install what is missing, build, and run configs/deploy_demo.yaml with
# `dsactor up`: an offload service (fp32 master weights + AdamW state, the optimizer step)
# and a ZeRO-2 trainer of the `small` GPT on the fortunes corpus, as two processes. Then
# prints a sample from the trained weights (runs/demo/model.safetensors; the resumable
# checkpoint is runs/demo/checkpoint). `dsactor up` prints the dashboard's URL first
# ("dsactor up: dashboard http://127.0.0.1:PORT/"): open it to watch the run.
# Builds only the `dsactor` binary (every role and `dsactor bench` are in it), not the tests,
# in build/ with the configuration scripts/test.sh uses, so neither one rebuilds the other's
# work.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh --target dsactor
./build/cli/dsactor up configs/deploy_demo.yaml
echo "--- sample (dsactor generate --weights runs/demo/model.safetensors) ---"
./build/cli/dsactor generate --weights runs/demo/model.safetensors --prompt "The " --tokens 300
