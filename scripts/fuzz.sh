#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] [TARGET...]: builds the AFL++ fuzz targets (classic afl-g++
# instrumentation, persistent mode from fuzz/afl_persistent.c, build-fuzz/), seeds each
# corpus from fuzz/seeds.txt and runs afl-fuzz on each target for SECONDS (default 60).
# Installs Debian's afl++ when it is missing. Exits 1 when any target found a crash or a hang that
# the CPU limit turned into one; the inputs are copied to fuzz-findings/<target>/ with the
# command that replays them. docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_PER_TARGET=${1:-60}
shift || true
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(dump regmap device_map qmp trace_text dat kvm_stats)
BUILD=${FUZZ_BUILD:-build-fuzz}
OUT=${FUZZ_OUT:-$BUILD/afl}
FINDINGS=${FUZZ_FINDINGS:-fuzz-findings}
MAX_SEED=262144  # afl-fuzz wants small seeds: larger binary files are skipped,
MAX_TEXT_SEED=32768  # and text is cut at a line (each exec reads the whole input)

# Preflight: Debian's afl++ (4.04c on Debian 12), installed when missing as install-deps.sh
# installs the build's packages (root, or sudo; CI is a clean Debian 12 machine as root).
if ! command -v afl-g++ >/dev/null || ! command -v afl-fuzz >/dev/null; then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || {
      echo "fuzz: afl-g++/afl-fuzz not found and not root: apt-get install afl++" >&2
      exit 2
    }
    SUDO=sudo
  fi
  echo "fuzz: installing afl++"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends afl++ >/dev/null
fi

# Classic afl-g++ for C++ (the GCC plugin refuses this compiler's version, clang 14 cannot
# compile std::expected); plain gcc for C, which builds the freestanding guest images.
export CCACHE_BASEDIR=$ROOT AFL_QUIET=1
# ccache when the machine has it (it is not a dependency: a fresh CI machine has none).
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# CI (EXITSCOPE_CI=1, .ci/run) builds with -Werror, as every other CI build.
werror=OFF
[[ -n ${EXITSCOPE_CI:-} ]] && werror=ON
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="${AFL_CC:-gcc}" -DCMAKE_CXX_COMPILER="${AFL_CXX:-afl-g++}" \
  "${launcher[@]}" -DEXITSCOPE_WERROR=$werror \
  -DEXITSCOPE_FUZZ=ON -DEXITSCOPE_BUILD_TESTS=OFF -DEXITSCOPE_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target "${TARGETS[@]/%/_fuzzer}"

export AFL_SKIP_CPUFREQ=1 AFL_NO_UI=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
  AFL_NO_AFFINITY=1 AFL_TRY_AFFINITY=1 AFL_SKIP_CRASHES=1
failed=0
summary=()
for t in "${TARGETS[@]}"; do
  seeds=$OUT/$t/seeds
  rm -rf "$OUT/$t"
  mkdir -p "$seeds"
  # Seeds: fuzz/seeds.txt globs, then this target's regression inputs.
  while read -r name glob; do
    [[ $name == "$t" ]] || continue
    for f in $glob; do
      [[ -f $f ]] || continue
      dst=$seeds/$(basename "$f")
      if [[ $(stat -c %s "$f") -le $MAX_SEED ]]; then
        cp "$f" "$dst"
      elif [[ $t == trace_text || $t == regmap || $t == device_map ]]; then
        head -c $MAX_TEXT_SEED "$f" | sed '$d' >"$dst"
      fi
    done
  done < <(grep -v '^#' fuzz/seeds.txt)
  [[ -d testdata/fuzz/$t ]] && find "testdata/fuzz/$t" -type f ! -name 'README*' -exec cp {} "$seeds/" \;
  echo "fuzz: $t: $(ls "$seeds" | wc -l) seeds, ${SECONDS_PER_TARGET}s"
  # -t: per-input time limit in ms (the machine is shared; a .dat Open forks a child).
  afl-fuzz -V "$SECONDS_PER_TARGET" -m 4096 -t "${FUZZ_TIMEOUT_MS:-2000}" -i "$seeds" \
    -o "$OUT/$t/out" -- "$BUILD/fuzz/${t}_fuzzer" >"$OUT/$t/afl.log" 2>&1 || {
    echo "fuzz: $t: afl-fuzz failed, see $OUT/$t/afl.log:" >&2
    tail -5 "$OUT/$t/afl.log" >&2
    failed=1
    continue
  }
  stats=$OUT/$t/out/default/fuzzer_stats
  field() { awk -v k="$1" '$1 == k { print $3 }' "$stats"; }
  crashes=$(find "$OUT/$t/out/default/crashes" -name 'id:*' 2>/dev/null | wc -l)
  mode=fork
  grep -q "Persistent mode binary detected" "$OUT/$t/afl.log" && mode=persistent
  [[ ${EXITSCOPE_FUZZ_FORK_PER_INPUT:-0} == 1 ]] && mode=fork
  line=$(printf '%-11s %-10s execs %9s  execs/s %7s  edges %5s  corpus %4s  crashes %s' "$t" \
    "$mode" "$(field execs_done)" "$(field execs_per_sec)" "$(field edges_found)" \
    "$(field corpus_count)" "$crashes")
  summary+=("$line")
  echo "fuzz: $line"
  if [[ $crashes -gt 0 ]]; then
    failed=1
    mkdir -p "$FINDINGS/$t"
    cp "$OUT/$t/out/default/crashes"/id:* "$FINDINGS/$t/"
    echo "fuzz: $t: $crashes crashing inputs copied to $FINDINGS/$t/; replay one with" >&2
    echo "  $BUILD/fuzz/${t}_replay $FINDINGS/$t/<file>   (or under gdb; any build with" >&2
    echo "  -DEXITSCOPE_FUZZ=ON has ${t}_replay), then add it to testdata/fuzz/$t/" >&2
  fi
done
echo "fuzz: summary (${SECONDS_PER_TARGET}s per target)"
printf '  %s\n' "${summary[@]}"
exit $failed
