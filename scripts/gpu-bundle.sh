#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs into .gpu/bundle.tar.xz, for a GPU machine that has
# the CUDA driver and NCCL but none of our Debian libraries and no package registry (the
# device machine lent to some sessions): the dsactor binary, the tests that take another
# path with a CUDA device, and every library they load except glibc's, CUDA's driver and
# NCCL (found there). Builds those targets first. Carry .gpu there, then run
#   bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-tests.sh
targets=(--target dsactor)
for t in "${GPU_TESTS[@]}"; do targets+=(--target "$t"); done
./scripts/build.sh "${targets[@]}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/build/cli" "$stage/build/tests" .gpu
cp build/cli/dsactor "$stage/build/cli/"
for t in "${GPU_TESTS[@]}"; do cp "build/tests/$t" "$stage/build/tests/"; done
strip "$stage"/build/cli/dsactor "$stage"/build/tests/*
for b in "$stage"/build/cli/dsactor "$stage"/build/tests/*; do ldd "$b"; done |
  awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux-x86-64|libnccl|libcuda)\.so' |
  xargs -I{} cp -L {} "$stage/lib/"
tar -C "$stage" -cf - . | xz -T0 -6 >.gpu/bundle.tar.xz
echo ".gpu/bundle.tar.xz: $(du -h .gpu/bundle.tar.xz | cut -f1)"
