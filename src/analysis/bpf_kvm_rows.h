// analysis/bpf_kvm_rows.h: a snapshot of the in-kernel maps (bpf_kvm_stat.h) as the
// KvmAnalysis that `exitscope kvm report` renders. Each map entry is decoded into the exit it
// stands for and fed to KvmAggregator (KvmAggregator::OnSamples, with the kernel's histogram
// buckets merged into the row): the keys, names, filters and groupings are kvm report's own.
//
//   BpfKvmRowOptions o{.analysis = aopts, .pvm = popts.pvm, .devices = popts.devices,
//                      .final = true};
//   BpfKvmRows rows = BuildBpfKvmRows(snapshot, o);
//   report::RenderKvmTable(rows.analysis, ctx /* ctx.pairing = &rows.pairing */, ropts);
//
// Exits the maps hold apart from the rows are placed as KvmPairer::Finish() would: a read
// exit still waiting for its completion is a timed sample (without its port when none came),
// a kvm_exit on a thread with no kvm_entry is a sample without time, and an exit in flight
// is listed in open_exits (with `final`, "open at end of trace"; else in flight now).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "analysis/kvm_stats.h"
#include "sources/bpf/bpf_kvm_stat.h"
#include "sources/kvm_decode.h"
#include "sources/kvm_pairing.h"

namespace exitscope::analysis {

using sources::bpf::BpfKvmSample;
using sources::bpf::BpfKvmSnapshot;

struct BpfKvmRowOptions {
  KvmAnalysisOptions analysis{};  // event, vcpu, pid, per_vcpu, per_vm (slow_ns unused)
  sources::PvmNumbering pvm = sources::PvmNumbering::kUpstream;
  const sources::KvmDeviceResolver* devices = nullptr;  // not owned; may be null
  bool final = false;         // the maps no longer change: exits in flight are open at end
  EventSink* also = nullptr;  // receives every entry's samples too (the diagnosis); may be null
};

// An exit in flight when the snapshot was taken (end == kOpenAtEnd, key set): how long it has
// been inside so far.
struct BpfKvmInFlight {
  KeptExit exit;
  uint64_t inside_ns = 0;
};

struct BpfKvmRows {
  KvmAnalysis analysis;
  sources::KvmPairingStats pairing;  // the program's counters, in the pairer's terms
  std::vector<BpfKvmInFlight> in_flight;
  uint64_t keys = 0;          // map entries read
  uint64_t lost_samples = 0;  // samples the program could not keep (maps full)
  uint64_t lost_records = 0;  // records of threads it could not track (thread map full)
};

BpfKvmRows BuildBpfKvmRows(const BpfKvmSnapshot& snap, const BpfKvmRowOptions& options);

// Each map entry of `snap` as the exit it stands for (vCPU numbered and device resolved as in
// the rows; only options.pvm and options.devices are used), with its samples: what
// `kvm stat --metrics` observes. The exit's strings live until `fn` returns.
void ForEachBpfKvmExit(const BpfKvmSnapshot& snap, const BpfKvmRowOptions& options,
                       const std::function<void(const ExitEvent&, const BpfKvmSample&)>& fn);

}  // namespace exitscope::analysis
