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
// Each key is a row of LatencyStats (count, sum, min, max, standard error, fixed-memory
// log-linear histogram for percentiles); an event costs one hash lookup per breakdown.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "analysis/histogram.h"
#include "sources/event.h"

namespace exitscope::analysis {

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
  // Exits at least this long are handed to on_slow (0: off), as perf's --duration.
  uint64_t slow_ns = 0;
  std::function<void(const ExitEvent&, std::string_view key)> on_slow{};
};

// One key's row.
struct KvmRow {
  std::string key;   // as printed: "IO", "0x3f8:POUT"
  std::string name;  // resolved name: device.register, MSR name; may be empty
  LatencyStats stats;
};

// The rows of one scope (everything, one VM, or one vCPU of one VM).
struct KvmGroup {
  int64_t vm = -1;                            // -1: all VMs
  int64_t vcpu = -1;                          // -1: all vCPUs
  std::vector<std::unique_ptr<KvmRow>> rows;  // in first-seen order
  uint64_t samples = 0;
  uint64_t time_ns = 0;
};

struct KvmAnalysis {
  KvmEventClass event = KvmEventClass::kVmexit;
  KvmGroup all;
  std::vector<std::unique_ptr<KvmGroup>> per_vm;    // sorted by vm at Finish()
  std::vector<std::unique_ptr<KvmGroup>> per_vcpu;  // sorted by (vm, vcpu)
  uint64_t exits_seen = 0;                          // every ExitEvent received
  uint64_t exits_filtered = 0;  // of which not in the class or filtered by --vcpu / -p
  uint64_t slow_exits = 0;
};

// Sort order of rows, as perf's --key plus percentiles. All descending.
enum class KvmSortKey : uint8_t { kSample = 0, kTime, kMax, kMin, kAvg, kP50, kP99, kP999 };
bool ParseKvmSortKey(std::string_view s, KvmSortKey* out) noexcept;
// Rows of `g` ordered by `key` (descending; ties by key text).
std::vector<const KvmRow*> SortedRows(const KvmGroup& g, KvmSortKey key);

class KvmAggregator final : public EventSink {
 public:
  explicit KvmAggregator(KvmAnalysisOptions options);
  void OnExit(const ExitEvent& e) override;
  // Sorts the breakdowns; call once the source is done (idempotent).
  void Finish();
  const KvmAnalysis& analysis() const noexcept { return analysis_; }
  const KvmAnalysisOptions& options() const noexcept { return options_; }
  // Clears every row (live mode: one interval at a time).
  void Reset();

 private:
  struct Key {
    std::string_view name;  // vmexit/userspace/hypercall: the reason; else empty
    uint64_t sub = 0;
    uint8_t dir = 0;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const noexcept {
      return std::hash<std::string_view>()(k.name) ^ (k.sub * 0x9e3779b97f4a7c15ull) ^ k.dir;
    }
  };
  struct GroupIndex {
    KvmGroup* group = nullptr;
    std::unordered_map<Key, KvmRow*, KeyHash> rows;
    KvmRow* last = nullptr;  // the row of the previous exit
    Key last_key;
  };
  bool Classify(const ExitEvent& e, Key* key) const;
  std::string KeyText(const Key& key, const ExitEvent& e) const;
  std::string NameText(const ExitEvent& e) const;
  void Add(GroupIndex& gi, const Key& key, const ExitEvent& e);
  GroupIndex& VmGroup(int64_t vm);
  GroupIndex& VcpuGroup(int64_t vm, int64_t vcpu);

  KvmAnalysisOptions options_;
  KvmAnalysis analysis_;
  GroupIndex all_;
  std::map<int64_t, GroupIndex> vm_groups_;
  std::map<std::pair<int64_t, int64_t>, GroupIndex> vcpu_groups_;
};

}  // namespace exitscope::analysis
