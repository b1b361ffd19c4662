#!/usr/bin/env bash
# Builds tests/fuzz with clang + libFuzzer and fuzzes one target for a bounded time.
#   run_fuzz.sh [build dir] [target]   (default: <repo>/build-fuzz, fuzz_decode; the others:
#                                       fuzz_rendezvous, fuzz_deploy_yaml, fuzz_key_files)
# Env: FUZZ_SECONDS (default 20), FUZZ_JOBS (build parallelism, default 2), CXX (clang++).
# Exit status is non-zero on a build failure or on any crash/leak/UB the fuzzer finds; the
# offending input is left in <build dir>/artifacts/<target>/ (replay: <target> <file>).
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-$src/../../build-fuzz}"
target="${2:-fuzz_decode}"
seconds="${FUZZ_SECONDS:-20}"
jobs="${FUZZ_JOBS:-2}"
cxx="${CXX:-clang++}"
case "$(basename "$cxx")" in
  clang++*) ;;
  *) cxx=clang++ ;;  # the parent build's g++ cannot link libFuzzer
esac
# A full path, so "clang++" and "/usr/bin/clang++" do not alternate in the cache (a
# compiler change makes CMake start the build dir over).
cxx="$(command -v "$cxx")" || { echo "run_fuzz.sh: $cxx not found" >&2; exit 1; }

generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }

# Seeds are regenerated each run (they follow the formats); what the fuzzer discovers
# accumulates in corpus-work/<target>/ across runs of the same build dir.
seeds="$build/seeds/$target"
work="$build/corpus-work/$target"
artifacts="$build/artifacts/$target"
rm -rf "$seeds"
mkdir -p "$seeds" "$work" "$artifacts"
max_len=65536
case "$target" in
  fuzz_decode)
    cmake --build "$build" -j "$jobs" --target fuzz_decode make_corpus
    "$build/make_corpus" "$seeds" ;;
  fuzz_rendezvous|fuzz_deploy_yaml|fuzz_key_files)
    cmake --build "$build" -j "$jobs" --target "$target" make_seeds
    "$build/make_seeds" "$target" "$seeds"
    if [ "$target" = fuzz_deploy_yaml ]; then
      cp "$src"/../../configs/*.yaml "$seeds"/
      max_len=8192  # a deployment file is small; longer inputs only slow the search
    fi ;;
  *) echo "run_fuzz.sh: unknown target $target" >&2; exit 2 ;;
esac

"$build/$target" "$work" "$seeds" \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len="$max_len" \
  -print_final_stats=1 -artifact_prefix="$artifacts/"
