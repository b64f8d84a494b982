#!/usr/bin/env bash
# check_library_only.sh SOURCE_DIR EXITSCOPE BINARY_TOOL [SANITIZERS]: the library configured,
# built and installed alone, as a VMM team builds it (docs/install.md, "What each option adds"):
# no tool, no tests, no benchmarks, no Prometheus endpoint, and CMake forbidden to find GoogleTest,
# Google Benchmark, prometheus-cpp, fmt, CLI11 and nlohmann-json (so it cannot have needed them).
# Then a C VMM built with pkg-config against that prefix alone records a dump which EXITSCOPE
# (this build's tool) reads, and es_serve_metrics says the endpoint is not built in.
# Skips (77) in a sanitizer build: the plain build covers it, and it is one more full build.
set -euo pipefail
src=$1 tool=$2 sanitize=${3:-}
[ -z "$sanitize" ] || { echo "SKIP: library-only build checked by the plain build"; exit 77; }
for t in cmake pkg-config ninja; do
  command -v $t >/dev/null || { echo "SKIP: $t is not on PATH"; exit 77; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/exitscope-libonly.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
no_find=()
for p in GTest benchmark prometheus-cpp fmt CLI11 nlohmann_json; do
  no_find+=("-DCMAKE_DISABLE_FIND_PACKAGE_$p=ON")
done
cmake -S "$src" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEXITSCOPE_BUILD_TOOLS=OFF \
  -DEXITSCOPE_BUILD_TESTS=OFF -DEXITSCOPE_BUILD_BENCH=OFF -DEXITSCOPE_PROMETHEUS=OFF \
  "${no_find[@]}" >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" >"$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; exit 1; }
targets=$(ninja -C "$tmp/build" -t targets all | grep -c -E '_test(:| )' || true)
[ "$targets" -eq 0 ] || { echo "the library-only build has $targets test targets"; exit 1; }
cmake --install "$tmp/build" --prefix "$tmp/prefix" >"$tmp/install.log"
[ ! -e "$tmp/prefix/bin/exitscope" ] || { echo "the tool was installed"; exit 1; }
[ ! -e "$tmp/prefix/include/exitscope/metrics.h" ] || { echo "metrics.h installed without the endpoint"; exit 1; }
export PKG_CONFIG_LIBDIR="$tmp/prefix/lib/pkgconfig:$tmp/prefix/lib64/pkgconfig"
cc -std=c11 -o "$tmp/vmm_c" "$src/tests/install/consumer_c/vmm.c" $(pkg-config --cflags --libs exitscope) \
  -Wl,-rpath,"$(pkg-config --variable=libdir exitscope)"
"$tmp/vmm_c" "$tmp/c.esdump" >/dev/null
"$tool" inspect "$tmp/c.esdump" | grep -q uart0 || { echo "the dump does not read"; exit 1; }
cat >"$tmp/metrics.c" <<'C'
#include <stdio.h>
#include "exitscope/exitscope.h"
int main(void) {
  es_options o;
  es_options_init(&o);
  es_recorder* r = NULL;
  if (es_recorder_create(&o, &r) != ES_OK) return 2;
  es_metrics* m = NULL;
  const es_status s = es_serve_metrics(r, "127.0.0.1:0", &m);
  printf("%d %s\n", (int)s, es_last_error());
  es_recorder_destroy(r);
  return s == ES_EUNAVAILABLE ? 0 : 1;
}
C
cc -std=c11 -o "$tmp/metrics" "$tmp/metrics.c" $(pkg-config --cflags --libs exitscope) \
  -Wl,-rpath,"$(pkg-config --variable=libdir exitscope)"
"$tmp/metrics" | grep -q "built without the Prometheus endpoint" || { echo "es_serve_metrics did not say why"; exit 1; }
libs=$(pkg-config --static --libs exitscope)
echo "library-only: built and installed without the tool, tests, benchmarks or Prometheus; a C VMM linked ($libs) and its dump read"
