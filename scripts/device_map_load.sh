#!/usr/bin/env bash
# Time and peak RSS of loading device maps of 4,000 / 16,000 / 250,000 ranges (one device per
# range), as a text map and as QEMU `info mtree -f` text, through `exitscope kvm report
# --device-map` (docs/recorder.md, "Address-space memory"). Usage:
#   scripts/device_map_load.sh [EXITSCOPE_BINARY] [RANGES...]
# Each run is capped at 4 GiB of address space, so a build with quadratic maps fails fast
# ("out of memory") instead of exhausting the machine. Timings are for reading only.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/exitscope}
shift || true
SIZES=("$@")
[[ ${#SIZES[@]} -gt 0 ]] || SIZES=(4000 16000 250000)
TRACE=testdata/kvm/pvm-user64-pio-mmio-hlt.dat
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

run() {  # label file
  local out
  out=$( (ulimit -v 4194304; /usr/bin/time -f '%e s, %M KB' "$BIN" kvm report -i "$TRACE" \
           --device-map "$2" >/dev/null 2>"$TMP/err") 2>&1; tail -1 "$TMP/err")
  printf '%-28s %s%s\n' "$1" "$out" "$(grep -q 'out of memory' "$TMP/err" && echo ' (out of memory)')"
}

printf '%-28s %s\n' "no map (the report alone)" \
  "$( (/usr/bin/time -f '%e s, %M KB' "$BIN" kvm report -i "$TRACE" >/dev/null) 2>&1 | tail -1)"
for n in "${SIZES[@]}"; do
  # perl-base is essential on Debian; mawk's printf cannot print 64-bit hex.
  perl -e 'for $i (0 .. $ARGV[0] - 1) { printf "dev%d x mmio 0x%x 0x1000\n", $i, 2**32 + $i * 4096 }' \
    "$n" >"$TMP/map$n.txt"
  perl -e 'print "FlatView #0\n AS \"memory\", root: system\n Root memory region: system\n";
    for $i (0 .. $ARGV[0] - 1) { $b = 2**32 + $i * 4096;
      printf "  %016x-%016x (prio 0, i/o): d%d\n", $b, $b + 4095, $i }' "$n" >"$TMP/mtree$n.txt"
  run "text map, $n ranges" "$TMP/map$n.txt"
  run "info mtree -f, $n ranges" "$TMP/mtree$n.txt"
done
