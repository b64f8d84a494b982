#!/usr/bin/env bash
# check_consumers.sh BUILD_DIR LIBDIR CC CXX GENERATOR [SANITIZERS]: a VMM's build against an installed
# exitscope, outside the source and build trees (docs/install.md). `cmake --install` into a
# temporary prefix, then, against that prefix alone:
#  - consumer_cxx: CMake, find_package(exitscope) -> exitscope::exitscope (libexitscope.so) and,
#    when prometheus-cpp is found, exitscope::exitscope_static (libexitscope.a);
#  - consumer_c: C11 with pkg-config (PKG_CONFIG_LIBDIR = the prefix's only), shared, and static
#    with exitscope.pc's Libs.private;
# each records one exit into a dump that the installed `exitscope inspect` reads.
# In a sanitizer build (SANITIZERS = EXITSCOPE_SANITIZE, e.g. address,undefined) the installed
# library is instrumented, so the consumers are built with the same -fsanitize, as a VMM
# linking such a build would be. Skips (77) with the reason printed only when cmake or
# pkg-config is missing.
set -euo pipefail
build=$1 libdir=$2 cc=$3 cxx=$4 gen=$5 sanitize=${6:-}
san=${sanitize:+-fsanitize=$sanitize}
src=$(cd "$(dirname "$0")" && pwd)
for tool in cmake pkg-config; do
  command -v $tool >/dev/null || { echo "SKIP: $tool is not on PATH"; exit 77; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/exitscope-consumers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
inspect() {  # inspect DUMP: the installed tool reads it
  "$prefix/bin/exitscope" inspect "$1" >"$tmp/inspect.log" 2>&1 ||
    { cat "$tmp/inspect.log"; echo "exitscope inspect $1 failed"; exit 1; }
  grep -q "uart0" "$tmp/inspect.log" || { cat "$tmp/inspect.log"; echo "no uart0 in the report"; exit 1; }
}

# C++ with find_package.
cmake -S "$src/consumer_cxx" -B "$tmp/cxx" -G "$gen" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="$san" >"$tmp/cxx.log" 2>&1 ||
  { cat "$tmp/cxx.log"; exit 1; }
grep -q "from $prefix/" "$tmp/cxx.log" || { cat "$tmp/cxx.log"; echo "exitscope not found in $prefix"; exit 1; }
cmake --build "$tmp/cxx" >>"$tmp/cxx.log" 2>&1 || { cat "$tmp/cxx.log"; exit 1; }
# (Whole outputs captured before grep -q: under pipefail, a grep that stops at its first match
# can fail the pipeline by SIGPIPE to a writer that has not finished.)
deps=$(ldd "$tmp/cxx/vmm_cxx")
grep -q "libexitscope.so.* => $prefix/" <<<"$deps" ||
  { echo "$deps"; echo "vmm_cxx does not load the prefix's libexitscope.so"; exit 1; }
"$tmp/cxx/vmm_cxx" "$tmp/cxx.esdump"
inspect "$tmp/cxx.esdump"
n=2
if [[ -x $tmp/cxx/vmm_cxx_static ]]; then
  "$tmp/cxx/vmm_cxx_static" "$tmp/cxx-static.esdump"
  inspect "$tmp/cxx-static.esdump"
  if grep -q 'NEEDED.*libexitscope' <<<"$(readelf -d "$tmp/cxx/vmm_cxx_static")"; then
    echo "vmm_cxx_static needs libexitscope.so"; exit 1
  fi
  n=$((n + 1))
else
  echo "note: exitscope::exitscope_static not defined (prometheus-cpp not found): static C++ not built"
fi

# C with pkg-config, against the prefix's exitscope.pc only.
export PKG_CONFIG_LIBDIR=$prefix/$libdir/pkgconfig PKG_CONFIG_PATH=
cflags=$(pkg-config --cflags exitscope) libs=$(pkg-config --libs exitscope)
private=$(pkg-config --static --libs exitscope | sed -E 's/(^| )-L[^ ]*//g; s/(^| )-lexitscope( |$)/ /')
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror -pedantic $san $cflags "$src/consumer_c/vmm.c" -o "$tmp/vmm_c" \
  $libs -Wl,-rpath,"$prefix/$libdir"
deps=$(ldd "$tmp/vmm_c")
grep -q "libexitscope.so.* => $prefix/" <<<"$deps" ||
  { echo "$deps"; echo "vmm_c does not load the prefix's libexitscope.so"; exit 1; }
"$tmp/vmm_c" "$tmp/c.esdump"
inspect "$tmp/c.esdump"
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror -pedantic $san $cflags "$src/consumer_c/vmm.c" \
  -o "$tmp/vmm_c_static" -L"$prefix/$libdir" -l:libexitscope.a $private
"$tmp/vmm_c_static" "$tmp/c-static.esdump"
inspect "$tmp/c-static.esdump"
echo "consumers: $((n + 1)) programs built against $(basename "$prefix") alone recorded one exit each; exitscope inspect read every dump"
