#!/usr/bin/env bash
# check_install.sh BUILD_DIR LIBDIR SOVERSION CC CXX: `cmake --install` into a temporary prefix
# and checks what lands there, from outside the tree (docs/install.md):
#  - libexitscope.so.SOVERSION is the SONAME, libexitscope.so and libexitscope.a are there;
#  - the CMake package (config, version, targets), exitscope.pc, bin/exitscope, the docs;
#  - every installed public header compiles alone against the prefix (C++20; exitscope.h also
#    as C11), so none needs src/ or another header first.
set -euo pipefail
build=$1 libdir=$2 sover=$3 cc=$4 cxx=$5
command -v cmake >/dev/null || { echo "SKIP: cmake is not on PATH"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/exitscope-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
fail=0
for f in "$libdir/libexitscope.so.$sover" "$libdir/libexitscope.so" "$libdir/libexitscope.a" \
    "$libdir/cmake/exitscope/exitscopeConfig.cmake" \
    "$libdir/cmake/exitscope/exitscopeConfigVersion.cmake" \
    "$libdir/cmake/exitscope/exitscopeTargets.cmake" \
    "$libdir/cmake/exitscope/exitscopeStaticTargets.cmake" \
    "$libdir/pkgconfig/exitscope.pc" include/exitscope/exitscope.h bin/exitscope \
    share/doc/exitscope/capi.md share/doc/exitscope/install.md; do
  [[ -e $prefix/$f ]] || { echo "not installed: $f"; fail=1; }
done
soname=$(readelf -d "$prefix/$libdir/libexitscope.so" | sed -nE 's/.*\(SONAME\).*\[(.*)\]/\1/p')
[[ $soname == "libexitscope.so.$sover" ]] || { echo "SONAME is '$soname'"; fail=1; }
if grep -rq "$(cd "$(dirname "$0")/../.." && pwd)" "$prefix/$libdir/cmake" "$prefix/$libdir/pkgconfig"; then
  echo "the installed CMake package or exitscope.pc names the source tree"; fail=1
fi
"$prefix/bin/exitscope" --version >/dev/null || { echo "installed exitscope --version failed"; fail=1; }

n=0
for h in "$prefix"/include/exitscope/*.h; do
  name=exitscope/$(basename "$h")
  echo "#include \"$name\"" | "$cxx" -std=c++20 -Wall -Wextra -Werror -pedantic -fsyntax-only \
    -I"$prefix/include" -x c++ - || { echo "not self-contained (C++20): $name"; fail=1; }
  n=$((n + 1))
done
echo '#include "exitscope/exitscope.h"' | "$cc" -std=c11 -Wall -Wextra -Werror -pedantic \
  -fsyntax-only -I"$prefix/include" -x c - || { echo "not C11: exitscope/exitscope.h"; fail=1; }

[[ $fail == 0 ]] || exit 1
echo "installed: SONAME $soname, $n public headers self-contained, CMake package and exitscope.pc"
