// analysis/kvm_stats.h: aggregates kvm ExitEvents the way `perf kvm stat report` does, by
// event class and key, with full latency distributions.
//
//   KvmAggregator agg({.event = KvmEventClass::kIoport, .per_vcpu = true});
//   KvmPairer pairer(opts, &agg);         // the aggregator is an EventSink
//   ... feed records ...
//   const KvmAnalysis& a = agg.analysis();  // a.all.rows, a.per_vcpu[...]
//
// Event classes and their keys (as perf's --event):
//   vmexit     every exit, keyed by reason ("IO", "EPT_VIOLATION", "HC_WRMSR")
//   userspace  exits that reached the VMM, keyed by KVM_EXIT_* reason
//   ioport     exits with a port, keyed by port and direction  ("0x3f8:POUT", "0x60:PIN")
//   mmio       exits with a guest-physical address             ("0xfebf1008:W")
//   msr        exits with an MSR index                          ("0xc0000080:R")
//   hypercall  hypercall exits, keyed by HC_* name or number   ("HC_WRMSR", "nr 0x9")
// Each key is a row of the grouping engine (exit_table.h: LatencyStats with count, sum, min,
// max, standard error, fixed-memory log-linear histogram for percentiles); an event costs one
// hash lookup per breakdown.
//
// Events without a time (ExitEvent::end != kSeen) are counted, never timed:
//  - an access handled in the kernel with no exit record (ExitEvent::kernel_access) is a
//    sample of the access classes (ioport, mmio, msr, hypercall), counted in `untimed` and
//    `in_kernel`; the exit classes (vmexit, userspace) skip it (kernel_accesses_skipped);
//  - an exit whose end the trace never carries (kvm_exit without any kvm_entry) is a sample
//    counted in `untimed`;
//  - an exit open at end of trace is in no row: it is listed in KvmAnalysis::open_exits.
// Samples = timed + untimed; Time% and the time columns cover timed samples only.
//
// Slow exits (at least KvmAnalysisOptions::slow_ns long, as perf's --duration: the SlowRule
// of kept_event.h) are counted in KvmAnalysis::slow_exits and the first kMaxSlowExitsKept of
// them listed in KvmAnalysis::slow, each with its row's key; on_slow, when set, is told of
// each as it is counted (to print a line as it happens).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "analysis/diagnosis.h"
#include "analysis/exit_table.h"
#include "analysis/kept_event.h"
#include "base/histogram.h"
#include "sources/event.h"

namespace exitscope::analysis {

using base::LatencyHistogram;  // base/histogram.h
using base::LatencyStats;

enum class KvmEventClass : uint8_t { kVmexit = 0, kUserspace, kIoport, kMmio, kMsr, kHypercall };
std::string_view ToString(KvmEventClass c) noexcept;
// Parses "vmexit" ... "hypercall"; false when unknown.
bool ParseKvmEventClass(std::string_view s, KvmEventClass* out) noexcept;
// perf's column title for the class ("VM-EXIT", "IO Port Access", "MMIO Access", ...).
std::string_view KvmEventTitle(KvmEventClass c) noexcept;

struct KvmAnalysisOptions {
  KvmEventClass event = KvmEventClass::kVmexit;
  int64_t vcpu = -1;  // only this vCPU (-1: all)
  int64_t pid = -1;   // only this VM (process) or thread (-1: all)
  bool per_vcpu = false;
  bool per_vm = false;
  // Exits at least this long are slow (0: off), as perf's --duration: counted, kept in
  // KvmAnalysis::slow, and handed to on_slow as they are counted (when set) with their row's
  // key.
  uint64_t slow_ns = 0;
  std::function<void(const ExitEvent&, std::string_view key)> on_slow{};
};

// A row and the rows of one scope (everything, one VM, or one vCPU of one VM) are the grouping
// engine's (exit_table.h), the same the exit-health report of a dump is made of.
using KvmRow = ExitRow;
using KvmGroup = ExitTable;

struct KvmAnalysis {
  KvmEventClass event = KvmEventClass::kVmexit;
  KvmGroup all;
  std::vector<std::unique_ptr<KvmGroup>> per_vm;    // sorted by vm at Finish()
  std::vector<std::unique_ptr<KvmGroup>> per_vcpu;  // sorted by (vm, vcpu)
  uint64_t exits_seen = 0;               // every exit received (kernel accesses not included)
  uint64_t exits_filtered = 0;           // of which not in the class or filtered by --vcpu / -p
  uint64_t slow_exits = 0;               // exits of the class at least slow_ns long
  std::vector<KeptExit> slow;            // the first kMaxSlowExitsKept of them, in order, with key
  uint64_t open_at_end = 0;              // exits of the class open at end of trace
  std::vector<KeptExit> open_exits;      // the first kMaxOpenExitsKept of them, in order, with key
  uint64_t kernel_accesses_seen = 0;     // ExitEvent::kernel_access events received
  uint64_t kernel_accesses_skipped = 0;  // of which not in the class or filtered
  static constexpr size_t kMaxOpenExitsKept = 1000;
  static constexpr size_t kMaxSlowExitsKept = 100000;
};

// Sort order of rows, as perf's --key plus percentiles. All descending.
using KvmSortKey = RowOrder;
// Parses "sample", "time", "max", "min", "avg" / "mean", "p50", "p99", "p999" / "p99.9".
bool ParseKvmSortKey(std::string_view s, KvmSortKey* out) noexcept;

class KvmAggregator final : public EventSink {
 public:
  explicit KvmAggregator(KvmAnalysisOptions options);
  void OnExit(const ExitEvent& e) override;
  // Samples of one exit key aggregated at the source (an entry of `kvm stat --bpf`'s in-kernel
  // maps, EventSink::OnSamples): `e` is the exit they all are (duration and end unused),
  // counted, classified and filtered as b.timed + b.untimed calls of OnExit would be.
  void OnSamples(const ExitEvent& e, const SampleBatch& b) override;
  // The printed key of the row `e` belongs to; false when the class or the filters leave it
  // out. Counts nothing (an exit still in flight, shown beside a refresh).
  bool RowKeyText(const ExitEvent& e, std::string* text) const;
  // The same as a view, valid until the next call of RowKeyView: the row's own text when the
  // row exists (no copy: the diagnosis asks this for every exit), else a string of the
  // aggregator's (so, unlike RowKeyText, not for concurrent callers).
  bool RowKeyView(const ExitEvent& e, std::string_view* text) const;
  // Sorts the breakdowns; call once the source is done (idempotent).
  void Finish();
  const KvmAnalysis& analysis() const noexcept { return analysis_; }
  const KvmAnalysisOptions& options() const noexcept { return options_; }
  // What makes an exit slow here (options().slow_ns); the HTML report's timeline marks the
  // same exits.
  const SlowRule& slow_rule() const noexcept { return slow_rule_; }
  // Whether OnExit(e) counts `e` in a row: in the event class, not a kernel access of an exit
  // class, and through the --vcpu / -p filters (the HTML report's timeline draws these).
  bool Counts(const ExitEvent& e) const;
  // Clears every row (live mode: one interval at a time).
  void Reset();
  // Moves the analysis out (call Finish() first); the aggregator is then empty, as Reset().
  KvmAnalysis TakeAnalysis();

 private:
  // perf's event classes are the key functions: Classify says whether an exit is in the class
  // and gives its RowKey (the reason, or the sub-key and direction), KeyText prints it.
  bool Classify(const ExitEvent& e, RowKey* key) const;
  std::string KeyText(const RowKey& key) const;
  std::string NameText(const ExitEvent& e) const;
  bool Keeps(const ExitEvent& e, RowKey* key) const;  // Counts, and the row's key
  // Counts n samples of `e` as seen; true when they belong in the rows.
  bool Admit(const ExitEvent& e, RowKey* key, uint64_t n);
  template <class... Batch>
  ExitRow& Add(ExitGrouper& g, const RowKey& key, const ExitEvent& e, const Batch&... b);
  ExitGrouper& VmGroup(int64_t vm);
  ExitGrouper& VcpuGroup(int64_t vm, int64_t vcpu);

  KvmAnalysisOptions options_;
  SlowRule slow_rule_;
  KvmAnalysis analysis_;
  std::unique_ptr<ExitGrouper> all_;
  // The exit OnExit counted last and its row of all_: RowKeyView of that same exit (the
  // diagnosis asks right after, on the same tee) takes the row's text without computing the
  // key again. `row` nullptr: none.
  struct LastExit {
    const ExitEvent* event = nullptr;
    uint64_t start_ns = 0;
    uint32_t tid = 0;
    const ExitRow* row = nullptr;
  };
  LastExit last_;
  mutable std::string key_text_;  // RowKeyView's text of a key that has no row yet
  // The row of all_ `e` belongs to (the last exit counted, or found by its key; null when the
  // key has no row yet, *key set then); false when the class or the filters leave it out.
  bool RowOf(const ExitEvent& e, const ExitRow** row, RowKey* key) const;
  bool IsLastExit(const ExitEvent& e) const noexcept {
    return last_.row != nullptr && last_.event == &e && last_.start_ns == e.start_ns &&
           last_.tid == e.tid;
  }
  std::map<int64_t, std::unique_ptr<ExitGrouper>> vm_groups_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<ExitGrouper>> vcpu_groups_;
};

// What the diagnosis calls slow where the command sets no threshold (--duration): 20 ms, the
// recorder's default and what guests start to notice.
inline constexpr uint64_t kDiagnosisSlowNs = 20'000'000;

// The diagnosis of a kvm analysis, as `kvm report` and `kvm stat` build it beside `agg`:
// grouped under the rows' keys (agg.RowKeyView: its filters too), slow by agg.slow_rule() or
// else kDiagnosisSlowNs. `agg` must outlive the options.
DiagnosisOptions KvmDiagnosisOptions(const KvmAggregator& agg);

}  // namespace exitscope::analysis
