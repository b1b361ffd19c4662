#!/usr/bin/env bash
# Builds tests/fuzz with clang + libFuzzer and fuzzes the wire decoder for a bounded time.
#   run_fuzz.sh [build dir]      (default: <repo>/build-fuzz)
# Env: FUZZ_SECONDS (default 20), FUZZ_JOBS (build parallelism, default 2), CXX (clang++).
# Exit status is non-zero on a build failure or on any crash/leak/UB the fuzzer finds; the
# offending input is left in <build dir>/artifacts/ (replay: fuzz_decode <file>).
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-$src/../../build-fuzz}"
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
cmake --build "$build" -j "$jobs" --target fuzz_decode make_corpus

# Seeds are regenerated each run (they follow the schema); what the fuzzer discovers
# accumulates in corpus-work/ across runs of the same build dir.
rm -rf "$build/seeds"
mkdir -p "$build/seeds" "$build/corpus-work" "$build/artifacts"
"$build/make_corpus" "$build/seeds"

"$build/fuzz_decode" "$build/corpus-work" "$build/seeds" \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$build/artifacts/"
