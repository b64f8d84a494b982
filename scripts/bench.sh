#!/usr/bin/env bash
# `make bench`: run every benchmark once, in the order of the docs that quote them.
# Timings are for reading, never for pass/fail; the machines are shared and noisy.
set -uo pipefail
BUILD=${1:-build}
B="$BUILD/bench"
echo "== recorder: cost of one recorded exit (docs/recorder.md) =="
"$B/recorder_benchmark" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
echo; echo "== kvm report vs trace-cmd report vs perf script (docs/kvm.md) =="
"$B/kvm_report_benchmark" --exits 400000
echo; echo "== tracefs raw-page reading and .dat writing (docs/kvm-live.md) =="
"$B/tracefs_benchmark"
echo; echo "== VMM: exit round trip with and without recording (docs/vmm.md) =="
"$B/vmm_overhead"
