#!/usr/bin/env bash
# Installs every Debian 12 package that dsactor's build, tests and demo need.
# Idempotent: packages already present are skipped; waits on the apt lock instead of failing.
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev clang-format
  # test and benchmark frameworks
  libgtest-dev libgmock-dev libbenchmark-dev
  # math
  libopenblas-openmp-dev
  # runtime glue and wire
  libcaf-dev libzmq3-dev cppzmq-dev libsodium-dev libssl-dev capnproto libcapnp-dev
  # storage
  librocksdb-dev liburing-dev
  # collectives
  libgloo-dev
  # utilities
  libspdlog-dev libfmt-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev
  # tokenizer: GPT-2's pre-tokenizer pattern (PCRE2); the GPT-2 reference encoder the tests
  # install from npm into the build folder
  libpcre2-dev nodejs npm
  # benchmarks' references and the demo corpus
  fio fortunes
  # promtool, which the metrics tests run on every exposition
  prometheus
  # the dashboard test's headless browser, driven over WebDriver
  chromium chromium-driver
)

# A package whose program is already on PATH from another source counts as present: machines
# that carry NodeSource's nodejs (which bundles npm and conflicts with Debian's npm) must not
# have apt try to replace it.
declare -A provided_by_command=([nodejs]=node [npm]=npm)

missing=()
for p in "${packages[@]}"; do
  if [ -n "${provided_by_command[$p]:-}" ] && command -v "${provided_by_command[$p]}" >/dev/null 2>&1; then
    continue
  fi
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=600 -y --no-install-recommends)
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
$sudo apt-get -o DPkg::Lock::Timeout=600 update
$sudo apt-get "${apt_opts[@]}" install "${missing[@]}"
