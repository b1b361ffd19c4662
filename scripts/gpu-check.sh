#!/usr/bin/env bash
# The device checks, for a machine with a CUDA GPU (the device machine when one is lent):
# builds with the CUDA toolkit and NCCL from /usr/local/cuda, then runs the tests that skip
# without a GPU: NcclCollectives (world size 1; 2 ranks with 2 devices) and the trainer's
# NCCL equivalence (1 rank bit-identical to `dsactor train`; 2 ranks within 1e-4), and
# reports what the build and the driver see. Prints every result; exits non-zero when a
# test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "nvidia-smi: not found"
if [ ! -d build ]; then ./scripts/install-deps.sh; fi
./scripts/build.sh
./build/cli/dsactor report
status=0
for t in test_nccl_collectives test_nccl_trainer; do
  echo "=== $t"
  ./build/tests/$t --gtest_brief=0 || status=1
done
exit $status
