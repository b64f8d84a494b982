#!/usr/bin/env bash
# `make demo`: boot the blk guest on /dev/kvm with a backend delay injected on a fraction of
# its I/Os, so a slow exit is found and explained; print the exit-health report; write a dump.
# Without /dev/kvm, show the report of the dump shipped in testdata/dumps/ instead.
set -euo pipefail
BUILD=${1:-build}
EXITSCOPE="$BUILD/exitscope"
DUMP=${DEMO_DUMP:-exitscope-demo.esdump}

# Open it to know: on some hosts the node exists but opening it fails (ENODEV). A character
# device first: `<>` would create a regular file named /dev/kvm where there is none.
kvm_works() {
  [ -c /dev/kvm ] || return 1
  { exec 3<>/dev/kvm; } 2>/dev/null || return 1
  exec 3>&-
}

if kvm_works; then
  echo "== exitscope run --guest blk (backend delay of 300 ms on every 64th nvme0 I/O) =="
  exec "$EXITSCOPE" run --guest blk --vcpus 2 --disk "$BUILD/demo-disk.img" \
    --inject backend-delay:nvme0:300:64 --dump "$DUMP"
fi

SHIPPED=testdata/kvm-host/blk-backend-delay.esdump
echo "== /dev/kvm is not available on this machine: exitscope run needs it =="
echo "== falling back to the report of a dump shipped in the repo: $SHIPPED =="
echo "== (the same demo run on a KVM host: exitscope run --guest blk --inject backend-delay:nvme0:300:64;"
echo "==  made before stack captures existed: exitscope inspect testdata/dumps/v4-c-example-stacks.esdump shows one) =="
echo
exec "$EXITSCOPE" inspect "$SHIPPED"
