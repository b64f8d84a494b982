// Aggregation by event class and key, filters, breakdowns and perf's statistics.
#include "analysis/kvm_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

namespace exitscope::analysis {
namespace {

ExitEvent Exit(std::string_view reason, uint64_t dur, uint32_t vcpu = 0, uint32_t vm = 1) {
  ExitEvent e;
  e.reason = reason;
  e.duration_ns = dur;
  e.vcpu = vcpu;
  e.vm = vm;
  e.tid = vm * 10 + vcpu;
  return e;
}
ExitEvent Port(uint16_t port, AccessDir dir, uint64_t dur, uint32_t vcpu = 0) {
  ExitEvent e = Exit("IO", dur, vcpu);
  e.subkey_kind = SubKeyKind::kPort;
  e.subkey = port;
  e.dir = dir;
  e.userspace = true;
  e.user_reason = "IO";
  return e;
}

const KvmRow* Find(const KvmGroup& g, std::string_view key) {
  for (const auto& r : g.rows) {
    if (r->key == key) return r.get();
  }
  return nullptr;
}

TEST(KvmStats, VmexitRowsByReasonWithPerfStatistics) {
  KvmAggregator agg({});
  for (uint64_t d : {1000, 2000, 3000, 4000}) agg.OnExit(Exit("HLT", d));
  agg.OnExit(Exit("MSR_WRITE", 500));
  agg.Finish();
  const KvmAnalysis& a = agg.analysis();
  ASSERT_EQ(a.all.rows.size(), 2u);
  const KvmRow* hlt = Find(a.all, "HLT");
  ASSERT_NE(hlt, nullptr);
  EXPECT_EQ(hlt->stats.count(), 4u);
  EXPECT_EQ(hlt->stats.sum(), 10000u);
  EXPECT_EQ(hlt->stats.min(), 1000u);
  EXPECT_EQ(hlt->stats.max(), 4000u);
  // perf's "+-": sqrt(var / n) / mean; var of 1,2,3,4 us (n-1) = 1.6667e6 ns^2.
  const double want = 100.0 * std::sqrt(1666666.6667 / 4.0) / 2500.0;
  EXPECT_NEAR(hlt->stats.RelStdErrPercent(), want, 1e-6);
  EXPECT_EQ(a.all.samples, 5u);
  EXPECT_EQ(a.all.time_ns, 10500u);
  const auto sorted = SortedRows(a.all, KvmSortKey::kSample);
  EXPECT_EQ(sorted[0]->key, "HLT");
  const auto by_min = SortedRows(a.all, KvmSortKey::kMin);
  EXPECT_EQ(by_min[0]->key, "HLT");  // descending: 1000 > 500
}

TEST(KvmStats, IoportKeysAsPerf) {
  KvmAggregator agg({.event = KvmEventClass::kIoport});
  agg.OnExit(Port(0x3f8, AccessDir::kWrite, 100));
  agg.OnExit(Port(0x3f8, AccessDir::kWrite, 300));
  agg.OnExit(Port(0x3fd, AccessDir::kRead, 200));
  agg.OnExit(Exit("HLT", 5000));  // not an ioport exit
  agg.Finish();
  const KvmAnalysis& a = agg.analysis();
  ASSERT_EQ(a.all.rows.size(), 2u);
  ASSERT_NE(Find(a.all, "0x3f8:POUT"), nullptr);
  EXPECT_EQ(Find(a.all, "0x3f8:POUT")->stats.count(), 2u);
  ASSERT_NE(Find(a.all, "0x3fd:PIN"), nullptr);
  EXPECT_EQ(a.exits_seen, 4u);
  EXPECT_EQ(a.exits_filtered, 1u);
}

TEST(KvmStats, MmioMsrHypercallAndUserspaceKeys) {
  ExitEvent mmio = Exit("EPT_MISCONFIG", 10);
  mmio.subkey_kind = SubKeyKind::kMmio;
  mmio.subkey = 0xfebf1008;
  mmio.dir = AccessDir::kWrite;
  mmio.device = "nvme0";
  mmio.reg = "SQ1TDBL";
  ExitEvent msr = Exit("MSR_WRITE", 20);
  msr.subkey_kind = SubKeyKind::kMsr;
  msr.subkey = 0x6e0;
  msr.dir = AccessDir::kWrite;
  ExitEvent hc = Exit("HC_WRMSR", 30);
  hc.subkey_kind = SubKeyKind::kHypercall;
  hc.subkey = 0x17088208;
  ExitEvent raw_hc = Exit("VMCALL", 40);
  raw_hc.subkey_kind = SubKeyKind::kHypercall;
  raw_hc.subkey = 9;
  ExitEvent user = Exit("EPT_VIOLATION", 50);
  user.userspace = true;
  user.user_reason = "MMIO";

  const auto run = [&](KvmEventClass c) {
    auto agg = std::make_unique<KvmAggregator>(KvmAnalysisOptions{.event = c});
    for (const ExitEvent* e : {&mmio, &msr, &hc, &raw_hc, &user}) agg->OnExit(*e);
    agg->Finish();
    return agg;
  };
  auto m = run(KvmEventClass::kMmio);
  ASSERT_EQ(m->analysis().all.rows.size(), 1u);
  EXPECT_EQ(m->analysis().all.rows[0]->key, "0xfebf1008:W");
  EXPECT_EQ(m->analysis().all.rows[0]->name, "nvme0.SQ1TDBL");
  auto s = run(KvmEventClass::kMsr);
  ASSERT_EQ(s->analysis().all.rows.size(), 1u);
  EXPECT_EQ(s->analysis().all.rows[0]->key, "0x6e0:W");
  EXPECT_EQ(s->analysis().all.rows[0]->name, "IA32_TSC_DEADLINE");
  auto h = run(KvmEventClass::kHypercall);
  ASSERT_EQ(h->analysis().all.rows.size(), 2u);
  EXPECT_NE(Find(h->analysis().all, "HC_WRMSR"), nullptr);
  ASSERT_NE(Find(h->analysis().all, "nr 0x9"), nullptr);
  EXPECT_EQ(Find(h->analysis().all, "nr 0x9")->name, "VMCALL");
  auto u = run(KvmEventClass::kUserspace);
  ASSERT_EQ(u->analysis().all.rows.size(), 1u);
  EXPECT_EQ(u->analysis().all.rows[0]->key, "MMIO");
}

TEST(KvmStats, FiltersAndBreakdowns) {
  std::vector<std::string> slow;
  KvmAggregator agg({.vcpu = -1,
                     .pid = -1,
                     .per_vcpu = true,
                     .per_vm = true,
                     .slow_ns = 1000,
                     .on_slow = [&](const ExitEvent& e, std::string_view key) {
                       slow.push_back(std::string(key) + "@" + std::to_string(e.vcpu));
                     }});
  agg.OnExit(Exit("HLT", 100, 0, 1));
  agg.OnExit(Exit("HLT", 5000, 1, 1));
  agg.OnExit(Exit("HLT", 200, 0, 2));
  agg.Finish();
  const KvmAnalysis& a = agg.analysis();
  ASSERT_EQ(a.per_vm.size(), 2u);
  EXPECT_EQ(a.per_vm[0]->vm, 1);
  EXPECT_EQ(a.per_vm[0]->samples, 2u);
  ASSERT_EQ(a.per_vcpu.size(), 3u);
  EXPECT_EQ(a.per_vcpu[1]->vm, 1);
  EXPECT_EQ(a.per_vcpu[1]->vcpu, 1);
  EXPECT_EQ(a.per_vcpu[1]->time_ns, 5000u);
  ASSERT_EQ(slow.size(), 1u);
  EXPECT_EQ(slow[0], "HLT@1");
  EXPECT_EQ(a.slow_exits, 1u);
  // The aggregator keeps the slow exit itself, with its row's key.
  ASSERT_EQ(a.slow.size(), 1u);
  EXPECT_EQ(a.slow[0].key, "HLT");
  EXPECT_EQ(a.slow[0].reason, "HLT");
  EXPECT_EQ(a.slow[0].duration_ns, 5000u);
  EXPECT_EQ(a.slow[0].vcpu, 1u);
  EXPECT_TRUE(agg.slow_rule().IsSlow(a.slow[0].view()));

  KvmAggregator only({.vcpu = 0, .pid = 2});
  only.OnExit(Exit("HLT", 100, 0, 1));
  only.OnExit(Exit("HLT", 5000, 1, 2));
  only.OnExit(Exit("HLT", 200, 0, 2));
  EXPECT_EQ(only.analysis().all.samples, 1u);
  EXPECT_EQ(only.analysis().all.time_ns, 200u);
  EXPECT_EQ(only.analysis().exits_filtered, 2u);

  only.Reset();
  EXPECT_EQ(only.analysis().all.samples, 0u);
  EXPECT_TRUE(only.analysis().all.rows.empty());
}

// Every slow exit is counted; the first kMaxSlowExitsKept are kept, in order. Exits open at
// end are never slow: they are kept in open_exits.
TEST(KvmStats, SlowExitsKeptUpToTheCapAllCounted) {
  KvmAggregator agg({.slow_ns = 1000});
  const size_t n = KvmAnalysis::kMaxSlowExitsKept + 3;
  for (size_t i = 0; i < n; ++i) {
    ExitEvent e = Exit("HLT", 1000 + i);
    e.start_ns = i;
    agg.OnExit(e);
  }
  ExitEvent open = Port(0x3f8, AccessDir::kWrite, 0);
  open.end = ExitEnd::kOpenAtEnd;
  open.duration_ns = 1'000'000;
  agg.OnExit(open);
  agg.Finish();
  const KvmAnalysis& a = agg.analysis();
  EXPECT_EQ(a.slow_exits, n);
  ASSERT_EQ(a.slow.size(), KvmAnalysis::kMaxSlowExitsKept);
  EXPECT_EQ(a.slow.front().start_ns, 0u);
  EXPECT_EQ(a.slow.back().start_ns, KvmAnalysis::kMaxSlowExitsKept - 1);
  EXPECT_EQ(a.open_at_end, 1u);
  ASSERT_EQ(a.open_exits.size(), 1u);
  EXPECT_TRUE(a.open_exits[0].open_at_end());
  EXPECT_EQ(a.open_exits[0].key, "IO");
  EXPECT_EQ(a.open_exits[0].subkey, 0x3f8u);

  KvmAggregator off({});  // no --duration: nothing slow
  off.OnExit(Exit("HLT", 1'000'000'000));
  EXPECT_EQ(off.analysis().slow_exits, 0u);
  EXPECT_TRUE(off.analysis().slow.empty());
  EXPECT_FALSE(off.slow_rule().enabled());
}

TEST(KvmStats, ParsersRejectUnknownNames) {
  KvmEventClass c;
  EXPECT_TRUE(ParseKvmEventClass("ioport", &c));
  EXPECT_EQ(c, KvmEventClass::kIoport);
  EXPECT_FALSE(ParseKvmEventClass("io", &c));
  KvmSortKey k;
  EXPECT_TRUE(ParseKvmSortKey("p999", &k));
  EXPECT_EQ(k, KvmSortKey::kP999);
  EXPECT_FALSE(ParseKvmSortKey("median", &k));
}

// RowKeyText of the exit OnExit just counted takes that row's text; an exit in the same storage
// afterwards (a pairer reuses one ExitEvent per thread) is keyed afresh, not by the last row.
TEST(KvmStats, RowKeyTextOfTheLastExitAndOfAnotherInTheSameStorage) {
  KvmAggregator agg({.event = KvmEventClass::kIoport});
  ExitEvent e = Port(0x3f8, AccessDir::kWrite, 100);
  e.start_ns = 1000;
  agg.OnExit(e);
  std::string text;
  ASSERT_TRUE(agg.RowKeyText(e, &text));
  EXPECT_EQ(text, "0x3f8:POUT");
  e = Port(0x3fd, AccessDir::kRead, 200);  // the next exit, same thread, same storage
  e.start_ns = 2000;
  ASSERT_TRUE(agg.RowKeyText(e, &text));  // before the aggregator has counted it
  EXPECT_EQ(text, "0x3fd:PIN");
  e = Exit("HLT", 5000);  // filtered out by the ioport class: no row, no text
  e.start_ns = 3000;
  agg.OnExit(e);
  EXPECT_FALSE(agg.RowKeyText(e, &text));
}

// RowKeyView gives the row's own text where the row exists (no copy: the diagnosis asks for
// every exit), the key formatted into the aggregator's own string where it does not yet.
TEST(KvmStats, RowKeyViewIsTheRowsOwnTextOnceTheRowExists) {
  KvmAggregator agg({.event = KvmEventClass::kIoport});
  ExitEvent e = Port(0x3f8, AccessDir::kWrite, 100);
  e.start_ns = 1000;
  std::string_view first;
  ASSERT_TRUE(agg.RowKeyView(e, &first));  // no row yet
  EXPECT_EQ(first, "0x3f8:POUT");
  agg.OnExit(e);
  std::string_view last;
  ASSERT_TRUE(agg.RowKeyView(e, &last));  // the exit just counted
  EXPECT_EQ(last, "0x3f8:POUT");
  ExitEvent again = Port(0x3f8, AccessDir::kWrite, 300);  // same key, other storage
  again.start_ns = 4000;
  std::string_view found;
  ASSERT_TRUE(agg.RowKeyView(again, &found));  // found by its key
  EXPECT_EQ(found.data(), last.data());        // both the row's own text
  ExitEvent fresh = Port(0x3fd, AccessDir::kRead, 200);
  std::string_view other;
  ASSERT_TRUE(agg.RowKeyView(fresh, &other));
  EXPECT_EQ(other, "0x3fd:PIN");
  EXPECT_EQ(found, "0x3f8:POUT");  // a row's text outlives the next call
  std::string text;
  ASSERT_TRUE(agg.RowKeyText(fresh, &text));  // the same through the copying form
  EXPECT_EQ(text, "0x3fd:PIN");
  ExitEvent hlt = Exit("HLT", 5000);  // no row in the ioport class
  EXPECT_FALSE(agg.RowKeyView(hlt, &other));
}

}  // namespace
}  // namespace exitscope::analysis
