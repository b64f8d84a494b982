// analysis/exit_table.h: the one grouping engine. Exits (ExitEvents of any source: a kernel
// trace, a recorder dump) are counted into rows by key; a row has count, total, min,
// p50/p99/p99.9, max and a fixed-memory histogram (LatencyStats), the samples without a time
// and the samples handled in the kernel. Every report renders these rows: the kvm tables
// (KvmAggregator, keyed by perf's event classes, kvm_stats.h) and the exit-health report
// (ExitSummaryBuilder, by kind, device, register and vCPU, exit_summary.h).
//
//   ExitTable t;
//   ExitGrouper g(&t);
//   RowKey k;
//   std::string scratch;
//   if (KeyOf(ExitKey::kRegister, e, &k, &scratch))
//     g.Add(g.Row(k, [&] { return RowText{KeyText(ExitKey::kRegister, k), {}}; }), e);
//   for (const ExitRow* r : SortedRows(t, RowOrder::kTime)) ...
//
// A sample is counted as: in_kernel when it never reached the VMM (ExitEvent::kernel_access or
// !userspace); untimed when its time is unknown (end != kSeen); else timed, into the row's
// LatencyStats. Exits open at end of capture are the caller's: they are in no row.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/histogram.h"
#include "sources/event.h"

namespace exitscope::analysis {

using base::LatencyHistogram;  // base/histogram.h
using base::LatencyStats;

// One key's row.
struct ExitRow {
  std::string key;         // as printed: "IO", "0x3f8:POUT", "nvme0.SQ1TDBL write", "1"
  std::string name;        // resolved name: device.register, MSR name; may be empty
  LatencyStats stats;      // samples with a known time
  uint64_t untimed = 0;    // samples whose time the source does not show
  uint64_t in_kernel = 0;  // samples (timed or not) handled in the kernel: no userspace exit
  uint64_t samples() const noexcept { return stats.count() + untimed; }
  uint64_t to_vmm() const noexcept { return samples() - in_kernel; }
};

// The rows of one breakdown in one scope (everything, one VM, or one vCPU of one VM), with
// the totals the percentages of a row are taken of.
struct ExitTable {
  int64_t vm = -1;                             // -1: all VMs
  int64_t vcpu = -1;                           // -1: all vCPUs
  std::vector<std::unique_ptr<ExitRow>> rows;  // first-seen order (SortInPlace reorders)
  uint64_t samples = 0;                        // every sample, timed or not
  uint64_t time_ns = 0;                        // of the timed samples
  uint64_t untimed = 0;                        // samples without a time
  uint64_t in_kernel = 0;                      // samples handled in the kernel
};

// What identifies a row: a name (a reason, a device, a key text) and up to two numbers (a
// sub-key and a direction). `name` may view the event's strings: the grouper keeps its own
// copy when it creates the row.
struct RowKey {
  std::string_view name;
  uint64_t sub = 0;
  uint8_t dir = 0;
  bool operator==(const RowKey&) const = default;
};

// The printed key and resolved name of a new row.
struct RowText {
  std::string key;
  std::string name;
};

// Samples of one key counted elsewhere arrive as a SampleBatch (sources/event.h, the in-kernel
// maps of `kvm stat --bpf`): the timed ones as LatencyHistogram bucket counts with their sum,
// min, max and sum of squares (LatencyStats::MergeBuckets), and the number without a time.

// Indexes one ExitTable by RowKey. Rows are heap objects (a LatencyStats is ~30 KiB) that
// never move: a pointer to one stays valid while the table lives, whatever is added or sorted.
class ExitGrouper {
 public:
  explicit ExitGrouper(ExitTable* table) : table_(table) {}
  ExitGrouper(const ExitGrouper&) = delete;
  ExitGrouper& operator=(const ExitGrouper&) = delete;

  // The row of `key`, created with make() -> RowText on first sight. Exits come in runs of a
  // few keys (a vCPU's PIO then MMIO, two vCPUs interleaved): the last kRecent rows are
  // tried before the hash.
  template <class MakeText>
  ExitRow& Row(const RowKey& key, MakeText&& make) {
    for (const Recent& r : recent_) {
      if (r.row != nullptr && r.key == key) return *r.row;
    }
    auto it = rows_.find(key);
    if (it == rows_.end()) it = Insert(key, make());
    Recent& r = recent_[next_recent_];
    next_recent_ = (next_recent_ + 1) % kRecent;
    r.row = it->second;
    r.key = it->first;  // views the row's own bytes
    return *r.row;
  }
  // The row of `key`, nullptr when none.
  ExitRow* Find(const RowKey& key) const;
  // Counts `e` as one sample of `row` and of the table (see the file comment).
  void Add(ExitRow& row, const ExitEvent& e) noexcept;
  // Counts a batch of samples of the exit `e` stands for (its duration and end unused) into
  // `row` and the table, as Add() would count each of them.
  void Add(ExitRow& row, const ExitEvent& e, const SampleBatch& b) noexcept;
  ExitTable& table() noexcept { return *table_; }

 private:
  struct Hash {
    size_t operator()(const RowKey& k) const noexcept {
      return std::hash<std::string_view>()(k.name) ^ (k.sub * 0x9e3779b97f4a7c15ull) ^ k.dir;
    }
  };
  using Index = std::unordered_map<RowKey, ExitRow*, Hash>;
  Index::iterator Insert(const RowKey& key, RowText text);

  ExitTable* table_;
  Index rows_;
  std::vector<std::unique_ptr<std::string>> names_;  // index key bytes that are no row's key
  struct Recent {
    ExitRow* row = nullptr;
    RowKey key;
  };
  static constexpr size_t kRecent = 4;
  std::array<Recent, kRecent> recent_{};
  size_t next_recent_ = 0;
};

// Keys any source's exits can be grouped by (the kvm event classes of kvm_stats.h add perf's
// sub-key keys). KeyOf returns false when the exit has no such key; `scratch` holds the
// bytes key->name views when they are built (kRegister).
//   kReason    the reason text: "MMIO", "PIO", "HLT" (dumps), "IO", "EPT_VIOLATION" (traces)
//   kDevice    exits with a port or MMIO address: the device, "unassigned" when none
//   kRegister  exits with a port or MMIO address: TargetName + direction, "nvme0.SQ1TDBL
//              write", "nvme0+0x2000 read", "unassigned 0xdead0000 read"
//   kVcpu      the vCPU index, "0", "1", ...
//   kVm        the VM (the VMM's pid), "4242"
enum class ExitKey : uint8_t { kReason = 0, kDevice, kRegister, kVcpu, kVm };
bool KeyOf(ExitKey k, const ExitEvent& e, RowKey* key, std::string* scratch);
// The printed key of a row of ExitKey `k`.
std::string KeyText(ExitKey k, const RowKey& key);

// Where an access went, without direction: "nvme0.SQ1TDBL", "nvme0+0x2000" (no register at
// that offset), "unassigned 0xdead0000", "nvme0 0x1234" (a device and no range holding the
// address); the reason ("HLT") for an exit without a port or MMIO address.
std::string TargetName(const ExitEvent& e);

// Sort order of rows: descending, ties by key text ascending. kSample ... kP999 as perf's
// --key plus percentiles; kKeyNumber orders keys that are numbers (vCPUs) ascending.
enum class RowOrder : uint8_t {
  kSample = 0,
  kTime,
  kMax,
  kMin,
  kAvg,
  kP50,
  kP99,
  kP999,
  kKeyNumber
};
// Rows of `t` in `order`.
std::vector<const ExitRow*> SortedRows(const ExitTable& t, RowOrder order);
// Reorders t.rows themselves (pointers to rows stay valid).
void SortInPlace(ExitTable& t, RowOrder order);

}  // namespace exitscope::analysis
