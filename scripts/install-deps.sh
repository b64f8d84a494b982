#!/usr/bin/env bash
# Installs the Debian packages exitscope needs to build, test and benchmark, only those missing.
# Safe to run repeatedly; does nothing (and needs no network) when everything is present.
set -euo pipefail

#
#   scripts/install-deps.sh          everything `make test` and `make bench` need
#   scripts/install-deps.sh --demo   only what `make demo` needs: the library and the tool
#                                    (no test or benchmark framework, no QEMU, Chromium,
#                                    Prometheus server, trace-cmd, perf or BPF toolchain)
# The library alone needs libunwind-dev, libdw-dev, libiberty-dev (+ prometheus-cpp-dev for its
# endpoint): docs/install.md, "What each option adds".
DEMO_PACKAGES=(
  g++ cmake ninja-build pkg-config make
  libunwind-dev libdw-dev libiberty-dev
  prometheus-cpp-dev
  libfmt-dev libcli11-dev nlohmann-json3-dev
  libtracefs-dev libtraceevent-dev libtracecmd-dev liburing-dev libzstd-dev zlib1g-dev
)
PACKAGES=(
  "${DEMO_PACKAGES[@]}" python3
  libgtest-dev libgmock-dev libbenchmark-dev
  trace-cmd linux-perf
  clang libbpf-dev bpftool
)
# Each wanted by one test only, which skips with a printed reason when its package could not be
# installed, so a failure here is not fatal: prometheus (tests/metrics: the real-Prometheus
# scrape), qemu-system-x86 (tests/sources/qemu_kvm_test: a real QEMU under kvm record).
OPTIONAL_PACKAGES=(prometheus qemu-system-x86)
# The HTML report (docs/html-report.md): npm at build time (`npm ci` of web/package-lock.json),
# chromium for its browser test; without them --format html says why and its tests skip.
command -v npm >/dev/null 2>&1 || OPTIONAL_PACKAGES+=(nodejs npm)
OPTIONAL_PACKAGES+=(chromium)
if [ "${1:-}" = "--demo" ]; then
  PACKAGES=("${DEMO_PACKAGES[@]}")
  OPTIONAL_PACKAGES=()
elif [ $# -gt 0 ]; then
  echo "usage: scripts/install-deps.sh [--demo]" >&2
  exit 2
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
optional_missing=()
for p in "${OPTIONAL_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    optional_missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && [ ${#optional_missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]} ${optional_missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    [ ${#missing[@]} -eq 0 ] && exit 0  # only optional ones: their tests skip
    echo "install-deps: missing packages (${missing[*]}) and not root: install them with apt-get" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#optional_missing[@]} -gt 0 ]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${optional_missing[@]}" >/dev/null ||
    echo "install-deps: could not install optional ${optional_missing[*]} (their tests will skip)" >&2
fi
