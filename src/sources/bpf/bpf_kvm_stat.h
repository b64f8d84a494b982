// sources/bpf/bpf_kvm_stat.h: loads kvm_stat.bpf.c (in-kernel pairing and histograms of KVM
// exits, `exitscope kvm stat --bpf`) and reads its maps.
//
//   auto s = BpfKvmStat::Open({.tgid = vmm_pid});   // loads, attaches the kvm tracepoints
//   if (!s) ... s.error().message: one line (not built, no BTF, no permission, no kvm events)
//   auto snap = (*s)->Read();                         // every interval: the maps as they are
//   (*s)->Detach();  auto last = (*s)->Read();        // at the end: exact, nothing in flight
//
// The program keeps, per exit key (BpfKvmKey: VMM pid, thread, vCPU, isa, reason, sub-key,
// direction, flags), count / sum / min / max / sum of squares and a log-linear histogram with
// LatencyHistogram's buckets; bpf_kvm_rows.h turns a snapshot into the KvmAnalysis that
// `kvm report` renders. Tracepoint field offsets are read from tracefs format files at Open(),
// so the object runs on any kernel layout; tracepoints this kernel lacks are not attached.
#pragma once

#include <linux/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exitscope/status.h"
#include "sources/event.h"

extern "C" {
#include "sources/bpf/kvm_stat_abi.h"
}

namespace exitscope::sources::bpf {

// True when this binary was built with the BPF program (clang, bpftool, libbpf and the
// build host's BTF were found at configure time).
bool BpfKvmStatBuilt() noexcept;

// How the programs attach. kTpBtf: BTF-typed raw tracepoints (tp_btf: the program reads the
// tracepoint's arguments, the kernel builds no trace record) for every event whose prototype
// in the kernel's BTF is the one the program expects, classic tracepoints for the others
// (kvm_exit, kvm_page_fault always); kTracepoint: classic tracepoints only; kAuto: kTpBtf,
// and classic tracepoints only if the kernel refuses the tp_btf programs.
enum class BpfAttach : uint8_t { kAuto = 0, kTpBtf, kTracepoint };

// How exits are paired in the kernel. kTracepoints: every kvm tracepoint `kvm report` reads,
// paired as sources/kvm_pairing.cc pairs them (kvm_exit -> kvm_entry; kvm_userspace_exit ->
// next kvm_fpu load with the run window's accesses), about six program runs per userspace
// exit. kKvmRun: userspace exits only, from kvm_userspace_exit to the next kvm_fpu load,
// their access read from the vCPU's struct kvm_run at the kvm_fpu unload that ends KVM_RUN
// (three program runs per exit; accesses handled in the kernel counted only for
// `access_kinds`); needs
// tp_btf and hosts where kvm_exit never fires (kvm-pvm). kAuto: kKvmRun where kvm_exit never
// fires (kvm_pvm loaded, neither kvm_intel nor kvm_amd) and the kernel takes the program,
// else kTracepoints.
enum class BpfPairing : uint8_t { kAuto = 0, kKvmRun, kTracepoints };

struct BpfKvmOptions {
  std::string tracefs_dir;  // for the format files; empty: FindTracefs()
  uint32_t tgid = 0;        // only this process (the VMM); 0: every process
  // Also the processes `tgid` forks from now on, and theirs (a VMM started by a wrapper or a
  // shell): followed in the kernel (sched_process_fork).
  bool follow_children = false;
  BpfAttach attach = BpfAttach::kAuto;
  BpfPairing pairing = BpfPairing::kAuto;
  // kKvmRun: the accesses handled in the kernel that are counted, 1u << KS_SUB_* each (the
  // table's --event ioport|mmio|msr|hypercall needs its kind; the exit classes need none).
  uint32_t access_kinds =
      (1u << KS_SUB_PORT) | (1u << KS_SUB_MMIO) | (1u << KS_SUB_MSR) | (1u << KS_SUB_HYPERCALL);
};

// One key's samples.
struct BpfKvmSample {
  ks_key key{};
  ks_stats stats{};
  std::vector<std::pair<uint32_t, uint64_t>> buckets;  // (LatencyHistogram bucket, count)
  long double sum_squares() const noexcept {
    return static_cast<long double>(stats.sq_hi) * 18446744073709551616.0L +
           static_cast<long double>(stats.sq_lo);
  }
  // The samples as the event model's aggregate (EventSink::OnSamples), the key's bytes as its
  // source_key. Views into this sample.
  SampleBatch batch() const noexcept {
    return {.buckets = buckets,
            .timed = stats.timed,
            .sum = stats.sum,
            .min = stats.min,
            .max = stats.max,
            .sum_squares = sum_squares(),
            .untimed = stats.untimed,
            .source_key = std::string_view(reinterpret_cast<const char*>(&key), sizeof key)};
  }
};

struct BpfKvmSnapshot {
  std::vector<BpfKvmSample> samples;
  std::vector<ks_thread> threads;  // every thread seen: the in-flight map (phase != KS_IDLE)
  ks_counters counters{};          // summed over CPUs
  uint64_t now_ns = 0;             // CLOCK_MONOTONIC at the read (the program's clock)
};

class BpfKvmStat {
 public:
  // Loads and attaches. Errors: kUnavailable (not built with BPF, no kvm tracepoints, the
  // kernel refused the program), kPermission (not allowed to load BPF).
  static Result<std::unique_ptr<BpfKvmStat>> Open(const BpfKvmOptions& options);
  ~BpfKvmStat();
  BpfKvmStat(const BpfKvmStat&) = delete;
  BpfKvmStat& operator=(const BpfKvmStat&) = delete;

  // The maps now. While attached, a key's counts may be one sample apart between its totals
  // and its buckets (the program updates them one after the other).
  Result<BpfKvmSnapshot> Read() const;
  // Detaches every program: the maps stop changing (call before the final Read()).
  void Detach() noexcept;
  // Attaches them again after Detach(), in the order Open() did (no-op while attached), to
  // the same maps: for switching the programs on and off, as bench/kvm_bpf_overhead does. An
  // exit that started before Detach() and ends after Attach() is timed across the gap; one
  // that started while detached is not counted.
  Status Attach();

  // The kernel's own accounting of the programs (BPF_ENABLE_STATS): EnableRunTimeStats()
  // turns it on until this object is destroyed (the kernel turns it off again when the last
  // holder closes its fd; it costs two clock reads per program run). RunTime() sums every
  // program's run count and run time; zero when not enabled.
  Status EnableRunTimeStats();
  struct RunTime {
    uint64_t runs = 0;
    uint64_t ns = 0;
  };
  RunTime ProgramRunTime() const;

  // Whether the kvm-run pairing was chosen (BpfPairing::kKvmRun).
  bool kvm_run() const noexcept { return kvm_run_; }
  // The tracepoints attached ("kvm_exit", ...), and those this kernel lacks.
  const std::vector<std::string>& attached() const noexcept { return attached_; }
  // How they are attached, one line: "tracepoint pairing; tp_btf: kvm_entry kvm_fpu ...;
  // tracepoint: kvm_exit ...", with why tp_btf or the kvm-run pairing was not used where it
  // was not ("tp_btf refused: ...").
  const std::string& attachment() const noexcept { return attachment_; }
  const std::vector<std::string>& missing() const noexcept { return missing_; }

 private:
  struct Impl;
  explicit BpfKvmStat(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> attached_, missing_;
  std::string attachment_;
  bool kvm_run_ = false;
};

// kvm-run pairing: every access hit is counted as handled in the kernel; this takes each
// userspace exit's own access (the PIO/MMIO/hypercall hit KVM emits for the access it hands
// the VMM) out of those counts: ended exits, and exits in flight whose hit came before the
// exit (writes, hypercalls; a read's hit comes with its completion after re-entry). MSR exits
// have no hit. Public for the tests.
void SubtractOwnAccesses(BpfKvmSnapshot* snap);

}  // namespace exitscope::sources::bpf
