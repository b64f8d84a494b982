#!/usr/bin/env bash
# check_exports.sh LIB INCLUDE_DIR: libexitscope.so exports the C API and the public C++ API only.
#  - every es_* function of exitscope/exitscope.h is defined and exported;
#  - every other exported symbol belongs to a class or function that include/exitscope/ marks
#    EXITSCOPE_EXPORT (no internal class, no anonymous namespace, no std:: template instance).
set -euo pipefail
lib=$1 inc=$2
syms=$(nm -D --defined-only "$lib" | awk '{print $3}')
fail=0

want_c=$(grep -ohE 'ES_EXPORT[^(]*\bes_[a-z0-9_]+\(' "$inc/exitscope/exitscope.h" |
         sed -E 's/.*\b(es_[a-z0-9_]+)\($/\1/' | sort -u)
for f in $want_c; do
  grep -qx "$f" <<<"$syms" || { echo "missing C API symbol: $f"; fail=1; }
done

public=$(cat "$inc"/exitscope/*.h |
         grep -oE '(class|struct) EXITSCOPE_EXPORT [A-Za-z_0-9]+|EXITSCOPE_EXPORT [^(]*\b[A-Za-z_0-9]+\(' |
         sed -E 's/\($//; s/.* //' | sort -u)
n_cxx=0
while read -r sym; do
  [[ -z $sym || $sym == es_* ]] && continue
  [[ $sym == _Z* ]] || { echo "exported C symbol outside the C API: $sym"; fail=1; continue; }
  d=$(c++filt "$sym")
  d=${d#typeinfo name for }; d=${d#typeinfo for }; d=${d#vtable for }
  owner=$(sed -nE 's/^exitscope::([A-Za-z_0-9]+).*/\1/p' <<<"$d")
  if [[ -z $owner ]] || ! grep -qx "$owner" <<<"$public"; then
    echo "internal symbol exported: $d"; fail=1
  fi
  n_cxx=$((n_cxx + 1))
done <<<"$syms"

[[ $fail == 0 ]] || exit 1
echo "libexitscope.so exports $(wc -w <<<"$want_c") C API functions and $n_cxx public C++ symbols"
