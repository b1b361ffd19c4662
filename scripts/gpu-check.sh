#!/usr/bin/env bash
# The device checks, for a machine with a CUDA GPU (the device machine when one is lent).
# Runs what a GPU host changes: the NCCL tests (world size 1; 2 ranks need 2 devices), the
# trainer's NCCL equivalence (1 rank bit-identical to `dsactor train`; 2 ranks within
# 1e-4), the services' CUDA pinning under every master-view, arena and ZeRO equivalence
# test, then `bench zero` on gpt2. Uses build/ where it is there; else unpacks
# .gpu/bundle.tar.xz (scripts/gpu-bundle.sh) and takes NCCL from the machine. Prints every
# result; exits non-zero when a test fails. Each test has 150 s.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-tests.sh
root=$PWD
command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "nvidia-smi: not found"
if [ ! -x build/cli/dsactor ]; then
  [ -f .gpu/bundle.tar.xz ] || { echo "no build/ and no .gpu/bundle.tar.xz (scripts/gpu-bundle.sh)"; exit 2; }
  unpacked=$(mktemp -d)
  tar -C "$unpacked" -xJf .gpu/bundle.tar.xz
  mkdir -p build/cli build/tests
  cp "$unpacked"/build/cli/dsactor build/cli/ && cp "$unpacked"/build/tests/* build/tests/
  nccl=$(find /usr/local /usr /opt -name 'libnccl.so.2' 2>/dev/null | head -1)
  export LD_LIBRARY_PATH="$unpacked/lib${nccl:+:$(dirname "$nccl")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The tests were built in /work/main and name their binary and sources by that path.
  built_in=$(grep -a -oE "/[^' \"]*/build/cli/dsactor" build/tests/test_cli_train | head -1)
  built_in=${built_in%/build/cli/dsactor}
  if [ -n "$built_in" ] && [ "$built_in" != "$root" ] && [ ! -e "$built_in" ]; then
    mkdir -p "$(dirname "$built_in")" && ln -s "$root" "$built_in"
  fi
fi
missing=$(ldd build/cli/dsactor | grep "not found")
[ -z "$missing" ] || { echo "missing libraries: $missing"; exit 2; }
./build/cli/dsactor report
status=0
for t in "${GPU_TESTS[@]}"; do
  echo "=== $t"
  log=$(mktemp)
  timeout 150 "./build/tests/$t" --gtest_brief=1 >"$log" 2>&1 || status=1
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|actual|Skipped' "$log" | head -40
done
echo "=== bench zero (gpt2, fp32, 3 steps)"
if timeout 180 ./build/cli/dsactor bench zero --steps 3 --json >/tmp/gpu-check-bench.json 2>/tmp/gpu-check-bench.err; then
  python3 - <<'PY' || cat /tmp/gpu-check-bench.json
import json
d = json.load(open("/tmp/gpu-check-bench.json"))
for k in ["step_time_ratio_prefetch_on", "step_time_ratio_prefetch_off", "peak_rss_ratio",
          "trainer_cpu_ratio_prefetch_on", "master_views"]:
    print(f"{k:32} {d.get(k)}")
s = d["stage3_prefetch_on"]
print(f"{'fetches_from_master_view':32} {s['fetches_from_master_view']} of {s['fetches']}")
print(f"{'service_cpu_ms_per_step':32} {s['service_cpu_ms_per_step']:.0f}")
print(f"{'service_cpu_over_adam_kernel':32} "
      f"{d['breakdown_prefetch_on']['service_cpu_over_adam_kernel']:.2f}")
PY
else
  status=1; tail -5 /tmp/gpu-check-bench.err
fi
exit $status
