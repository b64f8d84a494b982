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
echo; echo "== kvm report at the decompression floor, one capture (docs/trace-files.md) =="
"$B/kvm_dat_floor_benchmark"
echo; echo "== tracefs raw-page reading and .dat writing (docs/kvm-live.md) =="
"$B/tracefs_benchmark"
echo; echo "== VMM: exit round trip with and without recording (docs/vmm.md) =="
"$B/vmm_overhead"
echo; echo "== recorder at scale: 256 vCPUs x 65536 records, dump while writers run (docs/recorder.md) =="
"$B/recorder_scale"
echo; echo "== Prometheus scrape cost, 64 vCPUs x 20 registers (docs/prometheus.md) =="
"$B/metrics_scrape"
echo; echo "== cost per exit: no tracing, tracefs streaming, --bpf (docs/kvm-bpf.md) =="
"$B/kvm_bpf_overhead" --interleave 180
"$B/kvm_bpf_overhead" --rounds 3 --iterations 10000
echo; echo "== timeline of 1 M exits: time, bytes, memory (docs/timeline.md) =="
"$B/timeline_benchmark"
echo; echo "== device maps of 4,000 / 16,000 / 250,000 ranges: time, peak RSS (docs/recorder.md) =="
scripts/device_map_load.sh "$BUILD/exitscope"
