// sources/bpf/kvm_pair_sm.h, the pairing state machine of `kvm stat --bpf`, compiled here
// (as C++, and as ISO C11 in bpf_kvm_pair_sm_c11.c: both must count alike), fed every
// committed trace-cmd .dat under testdata/ and checked against KvmPairer
// (sources/kvm_pairing.h), without root and without BPF.
//
// Each .dat is read once through KvmInput (the reader `kvm report` uses), its kvm records kept
// in order; then they are replayed into a KvmPairer and into the state machine, the way the
// program sees them: one ks_rec per tracepoint hit, decoded from the record's fields as
// kvm_stat.bpf.c decodes the tracepoint's, timestamps in ns (the program reads
// bpf_ktime_get_ns(); here the capture clock converted by the pairer's own ClockScale, so
// both sides subtract the same numbers). The state machine's samples go into maps laid out as
// the program's (a key -> count / sum / min / max / sum of squares / buckets), and make a
// BpfKvmSnapshot as BpfKvmStat::Read() would. Then:
//
//  1. Per key, the exits ended inside the trace: every key the pairer emitted before
//     Finish() (ExitEvent fields the maps keep: VM, thread, vCPU, reason, isa, userspace
//     reason, sub-key kind and value, direction, size, kernel access, timed or not), decoded
//     from the maps by ForEachBpfKvmExit: same timed and untimed counts, sum, min, max and sum
//     of squares of the durations.
//  2. At the end of the trace: BuildBpfKvmRows(final) against KvmAggregator over every exit
//     the pairer emitted (Finish() included), for every event class, per vCPU: same rows,
//     samples, untimed, in-kernel, sum, min, max, open exits, and the pairing counters.
//  3. The kvm-run pairing (ks_sm_run_exit* at kvm_userspace_exit, ended at the next kvm_fpu
//     load): per thread and userspace reason, the same exits, open exits and durations.
//
// Differences by design, not checked (docs/kvm-bpf.md "Checked against KvmPairer"):
//  - the maps keep no single exit: no start time, guest RIP or value (so the per-key check
//    compares what a key holds, and no slow-exit list exists);
//  - children_outside_exit: the program counts only the run window's candidates dropped by a
//    kvm_exit or an entry without an exit (it never keeps the rest of the window: reads and
//    MSRs are counted as kernel accesses when they come, and kvm_emulate_insn /
//    kvm_page_fault / kvm_cpuid / kvm_inj_exception / vcpu_match_mmio of a window without an
//    exit are not kept at all), where KvmPairer counts every record it drops;
//  - lost records: the program has no ring buffer to lose from (a full map is counted
//    instead); every committed capture here has lost none (checked);
//  - the kvm-run pairing's sub-keys and in-kernel access counts come from the vCPU's struct
//    kvm_run, which no trace carries: only its timing and reasons are checked here
//    (bpf_kvm_stat_tracefs_test checks its keys on live guests);
//  - a run window open at the end of the input, whose reads and MSRs KvmPairer drops and the
//    program has counted (AnOpenWindowAtTheEndIsTheOneDifference pins it down).
// The committed captures take the paths real guests take; seeded random record sequences
// take the others (RandomRecordSequencesPairAsKvmPairer).
#include <linux/types.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "analysis/bpf_kvm_rows.h"
#include "analysis/kvm_stats.h"
#include "gtest/gtest.h"
#include "sources/bpf/bpf_kvm_stat.h"
#include "sources/bpf/kvm_stat_hist.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"
#include "support/testdata.h"

// The program's maps, for the state machine's two hooks (it calls them as it calls the BPF
// program's: free functions, defined before the header is included).
namespace {

struct KeyBytes {
  unsigned char b[sizeof(ks_key)];
  bool operator<(const KeyBytes& o) const { return std::memcmp(b, o.b, sizeof b) < 0; }
};

struct SlotAcc {
  ks_key key{};
  ks_stats stats{};
  std::map<uint32_t, uint64_t> buckets;
};

struct Maps {
  std::map<KeyBytes, SlotAcc> slots;  // ks_key_index + ks_slots + ks_rows
  ks_counters counters{};
};

Maps* g_maps = nullptr;

}  // namespace

static struct ks_counters* ks_sm_counters(void) {
  return &g_maps->counters;
}

// kvm_stat.bpf.c's ks_sm_add_sample, over a std::map instead of the BPF maps: the key completed
// with the thread's ids, then count / sum / min / max / sum of squares and the bucket.
static void ks_sm_add_sample(struct ks_thread* t, const struct ks_key* kin, __u64 d, int timed) {
  ks_key k = *kin;
  k.tgid = t->tgid;
  k.tid = t->tid;
  k.vcpu = t->vcpu;
  k.pad[0] = k.pad[1] = k.pad[2] = 0;
  KeyBytes kb;
  std::memcpy(kb.b, &k, sizeof k);
  SlotAcc& s = g_maps->slots[kb];
  s.key = k;
  if (!timed) {
    s.stats.untimed++;
    return;
  }
  s.buckets[ks_bucket_of(d)]++;
  ks_stats& st = s.stats;
  st.timed++;
  st.sum += d;
  if (st.timed == 1 || d < st.min) st.min = d;
  if (d > st.max) st.max = d;
  const unsigned __int128 sq = (static_cast<unsigned __int128>(st.sq_hi) << 64 | st.sq_lo) +
                               static_cast<unsigned __int128>(d) * d;
  st.sq_lo = static_cast<uint64_t>(sq);
  st.sq_hi = static_cast<uint64_t>(sq >> 64);
}

#include "sources/bpf/kvm_pair_sm.h"

// The same header compiled as ISO C11 (bpf_kvm_pair_sm_c11.c), its hooks the same maps.
extern "C" {
int ks_c11_record(struct ks_thread* t, const struct ks_rec* r, __u32 tid);
struct ks_counters* ks_c11_counters(void) {
  return ks_sm_counters();
}
void ks_c11_add_sample(struct ks_thread* t, const struct ks_key* k, __u64 d, int timed) {
  ks_sm_add_sample(t, k, d, timed);
}
}

namespace exitscope::sources::bpf {
namespace {

namespace fs = std::filesystem;
using analysis::BpfKvmRows;
using analysis::BuildBpfKvmRows;
using analysis::ForEachBpfKvmExit;
using analysis::KvmEventClass;

// A capture's kvm records, as KvmInput gives them to a pairer, and the clock they are in.
struct Capture {
  std::string name;
  ClockScale scale;
  std::vector<KvmRecord> records;
  KvmPairingStats read_stats;  // of the pairer the reader fed
};

struct Collect : EventSink {
  std::vector<ExitEvent> events;
  std::deque<std::string> strings;  // the events' views, kept
  void OnExit(const ExitEvent& e) override {
    ExitEvent c = e;
    c.reason = strings.emplace_back(e.reason);
    c.user_reason = strings.emplace_back(e.user_reason);
    c.device = {};
    c.reg = {};
    events.push_back(c);
  }
};

using test::CommittedDats;

// Reads `path` (false: the reader refuses it, `why` says why).
bool ReadCapture(const fs::path& path, Capture* c, std::string* why) {
  // A fixed TSC frequency: durations must not depend on the host that runs the test (both
  // sides convert with the same scale).
  auto in = KvmInput::Open(path.string(), {.tsc_khz = 2'600'000});
  if (!in) {
    *why = in.error().message;
    return false;
  }
  c->name = fs::relative(path, EXITSCOPE_TESTDATA_DIR).string();
  c->scale = (*in)->scale();
  Collect sink;
  KvmPairer p({.clock = c->scale}, &sink);
  p.SetRecordObserver(
      [](const KvmRecord& r, void* ctx) { static_cast<Capture*>(ctx)->records.push_back(r); }, c);
  if (Status s = (*in)->ReadAll(&p); !s.has_value()) {
    *why = s.error().message;
    return false;
  }
  c->read_stats = p.stats();
  return true;
}

// The tracepoint's fields as kvm_stat.bpf.c's handle() reads them into a ks_rec (the classic
// tracepoint and tp_btf programs read the same values).
ks_rec RecOf(const KvmRecord& r, uint64_t ts_ns) {
  ks_rec x{};
  x.vcpu_id = -1;
  x.ts = ts_ns;
  x.type = static_cast<uint32_t>(r.type) - 1;  // KS_EV_* order is KvmEventType's, less kOther
  switch (r.type) {
    case KvmEventType::kExit:
      x.exit_reason = r.exit_reason;
      x.isa = r.isa;
      x.info1 = r.info1;
      x.info2 = r.info2;
      if (r.vcpu_id >= 0) x.vcpu_id = static_cast<int32_t>(r.vcpu_id);
      break;
    case KvmEventType::kEntry:
    case KvmEventType::kPageFault:
      if (r.vcpu_id >= 0) x.vcpu_id = static_cast<int32_t>(r.vcpu_id);
      break;
    case KvmEventType::kUserspaceExit:
      x.reason = r.reason;
      x.err = r.err;
      break;
    case KvmEventType::kFpu:
      x.write = r.write;
      break;
    case KvmEventType::kPio:
      x.write = r.write;
      x.addr = r.addr;
      x.size = r.size;
      break;
    case KvmEventType::kMmio:
      x.mmio_type = r.mmio_type;
      x.size = r.size;
      x.addr = r.addr;
      x.write = r.mmio_type == KS_MMIO_WRITE;
      break;
    case KvmEventType::kMsr:
      x.write = r.write;
      x.addr = static_cast<uint32_t>(r.addr);
      break;
    case KvmEventType::kHypercall:
      x.addr = r.addr;
      break;
    case KvmEventType::kEmulateInsn:
      x.insn_dir = ks_sm_insn_dir_of(r.insn.data(), r.insn_len);
      break;
    case KvmEventType::kVcpuMatchMmio:
      x.addr = r.addr;
      x.write = r.write;
      break;
    default:
      break;
  }
  return x;
}

// The tracepoints the program attaches (sched_switch and unknown events are not among them).
bool Attached(KvmEventType t) {
  return t >= KvmEventType::kExit && t <= KvmEventType::kCpuid;
}

// The program's per-thread entries and maps after a capture.
struct Program {
  Maps maps;
  std::map<uint32_t, ks_thread> threads;
  uint64_t now_ns = 0;

  // thread_of(): the thread's entry, new ones started as the program starts them.
  ks_thread* ThreadOf(const KvmRecord& r, uint64_t ns) {
    const auto tid = static_cast<uint32_t>(r.tid);
    auto [it, inserted] = threads.try_emplace(tid);
    ks_thread* t = &it->second;
    if (inserted) KS_SM_THREAD_START(t, tid, ns);
    // The program knows every thread's process; a trace may not: then the pairer's VM is the
    // thread itself, and so is it here.
    t->tgid = static_cast<uint32_t>(r.tgid >= 0 ? r.tgid : r.tid);
    const auto type = static_cast<uint32_t>(r.type) - 1;
    if (type < KS_EV_COUNT) t->records[type]++;
    now_ns = ns;
    return t;
  }

  BpfKvmSnapshot Snapshot() const {
    BpfKvmSnapshot s;
    for (const auto& [kb, acc] : maps.slots) {
      BpfKvmSample x;
      x.key = acc.key;
      x.stats = acc.stats;
      x.buckets.assign(acc.buckets.begin(), acc.buckets.end());
      s.samples.push_back(std::move(x));
    }
    s.counters = maps.counters;
    for (const auto& [tid, t] : threads) {
      s.threads.push_back(t);
      // As Read() sums them: each thread counts its own tracepoint hits.
      for (int e = 0; e < KS_EV_COUNT; ++e) s.counters.records[e] += t.records[e];
    }
    s.now_ns = now_ns;
    return s;
  }
};

// The tracepoint pairing: every attached record through ks_sm_record (or `record`: the C11
// copy's).
using RecordFn = int (*)(ks_thread*, const ks_rec*, __u32);
void RunTracepointPairing(const Capture& c, const std::vector<KvmRecord>& records, Program* prog,
                          RecordFn record = &ks_sm_record) {
  g_maps = &prog->maps;
  for (const KvmRecord& r : records) {
    if (!Attached(r.type)) continue;
    const uint64_t ns = c.scale.ToNs(r.ts);
    ks_thread* t = prog->ThreadOf(r, ns);
    const ks_rec x = RecOf(r, ns);
    record(t, &x, t->tid);
  }
  g_maps = nullptr;
}

// The kvm-run pairing: its programs on kvm_fpu load and kvm_userspace_exit. The kvm_run head
// the program reads carries the tracepoint's own exit_reason; its access fields are not in a
// trace (left zero: only reasons and times are compared).
void RunKvmRunPairing(const Capture& c, Program* prog) {
  g_maps = &prog->maps;
  for (const KvmRecord& r : c.records) {
    if (r.type == KvmEventType::kFpu && r.write == 1) {
      const uint64_t ns = c.scale.ToNs(r.ts);
      ks_thread* t = prog->ThreadOf(r, ns);
      if (ks_sm_run_exit_open(t)) ks_sm_end_exit(t, ns);
    } else if (r.type == KvmEventType::kUserspaceExit) {
      const uint64_t ns = c.scale.ToNs(r.ts);
      ks_thread* t = prog->ThreadOf(r, ns);
      ks_sm_run_exit_begin(t, t->tid);
      ks_kvm_run_head h{};
      h.exit_reason = r.reason;
      ks_sm_run_exit(t, &h, ns, r.reason, r.err);
    }
  }
  g_maps = nullptr;
}

// What a map key keeps of an exit, printed.
std::string KeyOf(const ExitEvent& e) {
  return fmt::format(
      "vm {} tid {} vcpu {} {} isa {} user {}:{} sub {}:{:#x} dir {} size {} access {} failed {} "
      "{}",
      e.vm, e.tid, e.vcpu, e.reason, static_cast<int>(e.isa), e.userspace, e.user_reason,
      static_cast<int>(e.subkey_kind), e.subkey, static_cast<int>(e.dir), e.size, e.kernel_access,
      e.failed_vmentry, e.end == ExitEnd::kSeen ? "timed" : "untimed");
}

struct Acc {
  uint64_t timed = 0, untimed = 0, sum = 0, min = 0, max = 0;
  unsigned __int128 sq = 0;
  void Add(uint64_t d) {
    min = timed == 0 ? d : std::min(min, d);
    max = std::max(max, d);
    ++timed;
    sum += d;
    sq += static_cast<unsigned __int128>(d) * d;
  }
  // One map entry's samples (several entries may make one key: "restart" is any reason's).
  void Merge(const ks_stats& s) {
    if (s.timed) {
      min = timed == 0 ? s.min : std::min<uint64_t>(min, s.min);
      max = std::max<uint64_t>(max, s.max);
    }
    timed += s.timed;
    untimed += s.untimed;
    sum += s.sum;
    sq += static_cast<unsigned __int128>(s.sq_hi) << 64 | s.sq_lo;
  }
  bool operator==(const Acc&) const = default;
};

std::string Str(const Acc& a) {
  return fmt::format("timed {} untimed {} sum {} min {} max {} sq {:#x}{:016x}", a.timed, a.untimed,
                     a.sum, a.min, a.max, static_cast<uint64_t>(a.sq >> 64),
                     static_cast<uint64_t>(a.sq));
}

// Differences between two keyed tallies, one line each ("" when none).
std::vector<std::string> Diff(const std::map<std::string, Acc>& pairer,
                              const std::map<std::string, Acc>& sm) {
  std::vector<std::string> out;
  for (const auto& [k, a] : pairer) {
    auto it = sm.find(k);
    if (it == sm.end()) {
      out.push_back(fmt::format("only KvmPairer: {}: {}", k, Str(a)));
    } else if (!(it->second == a)) {
      out.push_back(fmt::format("{}: KvmPairer {} / state machine {}", k, Str(a), Str(it->second)));
    }
  }
  for (const auto& [k, a] : sm) {
    if (!pairer.contains(k)) out.push_back(fmt::format("only state machine: {}: {}", k, Str(a)));
  }
  return out;
}

// The maps' samples, per key.
std::map<std::string, Acc> SmPerKey(const BpfKvmSnapshot& snap) {
  std::map<std::string, Acc> out;
  ForEachBpfKvmExit(
      snap, {}, [&](const ExitEvent& e, const BpfKvmSample& s) { out[KeyOf(e)].Merge(s.stats); });
  return out;
}

std::map<std::string, Acc> PairerPerKey(const std::vector<ExitEvent>& events) {
  std::map<std::string, Acc> out;
  for (const ExitEvent& e : events) {
    Acc& a = out[KeyOf(e)];
    if (e.end == ExitEnd::kSeen) {
      a.Add(e.duration_ns);
    } else {
      ++a.untimed;
    }
  }
  return out;
}

// A capture through both: the pairer's exits before and at Finish(), and the program.
struct Both {
  Collect sink;                  // every exit the pairer emitted (Finish() included)
  std::vector<ExitEvent> ended;  // those emitted while records were fed (views into sink)
  KvmPairingStats stats;
  Program prog;
  const std::vector<ExitEvent>& all() const { return sink.events; }
};

void RunBoth(const Capture& c, const std::vector<KvmRecord>& sm_records, Both* b) {
  KvmPairer p({.clock = c.scale}, &b->sink);
  for (const KvmRecord& r : c.records) p.Feed(r);
  b->ended = b->sink.events;
  p.Finish();
  b->stats = p.stats();
  RunTracepointPairing(c, sm_records, &b->prog);
}

// Check 1: per key, exits ended inside the trace.
std::vector<std::string> PerKeyDifferences(const Both& b) {
  return Diff(PairerPerKey(b.ended), SmPerKey(b.prog.Snapshot()));
}

// Check 2: kvm report's rows and counters, at the end.
std::vector<std::string> RowDifferences(const Both& b) {
  std::vector<std::string> out;
  const BpfKvmSnapshot snap = b.prog.Snapshot();
  for (int cls = 0; cls <= static_cast<int>(KvmEventClass::kHypercall); ++cls) {
    const analysis::KvmAnalysisOptions o{.event = static_cast<KvmEventClass>(cls),
                                         .per_vcpu = true};
    analysis::KvmAggregator agg(o);
    for (const ExitEvent& e : b.all()) agg.OnExit(e);
    agg.Finish();
    const analysis::KvmAnalysis want = agg.TakeAnalysis();
    const BpfKvmRows got = BuildBpfKvmRows(snap, {.analysis = o, .final = true});
    const std::string c(analysis::ToString(o.event));
    auto rows = [](const analysis::KvmGroup& g) {
      std::map<std::string, std::string> m;
      for (const auto& r : g.rows) {
        m[r->key] = fmt::format("samples {} untimed {} in_kernel {} timed {} sum {} min {} max {}",
                                r->samples(), r->untimed, r->in_kernel, r->stats.count(),
                                r->stats.sum(), r->stats.min(), r->stats.max());
      }
      return m;
    };
    auto cmp = [&](const std::string& scope, const analysis::KvmGroup& w,
                   const analysis::KvmGroup& g) {
      const auto wr = rows(w), gr = rows(g);
      for (const auto& [k, v] : wr) {
        auto it = gr.find(k);
        if (it == gr.end() || it->second != v) {
          out.push_back(fmt::format("{} {} row {}: kvm report {} / --bpf {}", c, scope, k, v,
                                    it == gr.end() ? "none" : it->second));
        }
      }
      for (const auto& [k, v] : gr) {
        if (!wr.contains(k)) out.push_back(fmt::format("{} {} row {} only in --bpf", c, scope, k));
      }
    };
    cmp("all", want.all, got.analysis.all);
    std::map<std::pair<int64_t, int64_t>, const analysis::KvmGroup*> gv;
    for (const auto& g : got.analysis.per_vcpu) gv[{g->vm, g->vcpu}] = g.get();
    if (want.per_vcpu.size() != got.analysis.per_vcpu.size()) {
      out.push_back(fmt::format("{}: {} vCPU groups / --bpf {}", c, want.per_vcpu.size(),
                                got.analysis.per_vcpu.size()));
    }
    for (const auto& g : want.per_vcpu) {
      const std::string scope = fmt::format("vm {} vcpu {}", g->vm, g->vcpu);
      auto it = gv.find({g->vm, g->vcpu});
      if (it == gv.end()) {
        out.push_back(fmt::format("{} {}: no such group in --bpf", c, scope));
      } else {
        cmp(scope, *g, *it->second);
      }
    }
    auto num = [&](const char* what, uint64_t w, uint64_t g) {
      if (w != g) out.push_back(fmt::format("{} {}: kvm report {} / --bpf {}", c, what, w, g));
    };
    num("exits_seen", want.exits_seen, got.analysis.exits_seen);
    num("exits_filtered", want.exits_filtered, got.analysis.exits_filtered);
    num("open_at_end", want.open_at_end, got.analysis.open_at_end);
    num("open_exits", want.open_exits.size(), got.analysis.open_exits.size());
    num("kernel_accesses_seen", want.kernel_accesses_seen, got.analysis.kernel_accesses_seen);
    if (cls == 0) {
      const KvmPairingStats& w = b.stats;
      const KvmPairingStats& g = got.pairing;
      num("pairing.exits", w.exits, g.exits);
      num("pairing.kernel_exits", w.kernel_exits, g.kernel_exits);
      num("pairing.userspace_exits", w.userspace_exits, g.userspace_exits);
      num("pairing.open_at_end", w.open_at_end, g.open_at_end);
      num("pairing.exits_time_unknown", w.exits_time_unknown, g.exits_time_unknown);
      num("pairing.kernel_accesses", w.kernel_accesses, g.kernel_accesses);
      num("pairing.completions", w.completions, g.completions);
      num("pairing.unpaired_exits", w.unpaired_exits, g.unpaired_exits);
      num("pairing.entries_without_exit", w.entries_without_exit, g.entries_without_exit);
      for (size_t i = 1; i < kKvmEventTypeCount && i <= KS_EV_COUNT; ++i) {
        num(fmt::format("records[{}]", KvmEventName(static_cast<KvmEventType>(i))).c_str(),
            w.records[i], g.records[i]);
      }
    }
  }
  return out;
}

// Check 3: the kvm-run pairing, per thread and reason: ended exits' durations, open exits.
std::vector<std::string> KvmRunDifferences(const Capture& c, const Both& b) {
  Program prog;
  RunKvmRunPairing(c, &prog);
  std::map<std::string, Acc> want, got;
  auto key = [](uint32_t tid, std::string_view reason, bool open) {
    return fmt::format("tid {} {}{}", tid, reason, open ? " open at end" : "");
  };
  for (const ExitEvent& e : b.all()) {
    if (!e.userspace || e.kernel_access || e.isa != Isa::kUnknown) continue;
    Acc& a = want[key(e.tid, e.user_reason, e.end == ExitEnd::kOpenAtEnd)];
    if (e.end == ExitEnd::kSeen) {
      a.Add(e.duration_ns);
    } else {
      ++a.untimed;
    }
  }
  const BpfKvmSnapshot snap = prog.Snapshot();
  ForEachBpfKvmExit(snap, {}, [&](const ExitEvent& e, const BpfKvmSample& s) {
    got[key(e.tid, e.user_reason, false)].Merge(s.stats);
  });
  for (const ks_thread& t : snap.threads) {
    if (!ks_sm_run_exit_open(&t)) continue;
    std::string name(t.ev.user_err < 0 ? (t.ev.user_err == -4 ? "restart" : "error")
                                       : UserspaceExitName(t.ev.user_reason));
    if (name.empty()) name = fmt::format("KVM_EXIT_{}", t.ev.user_reason);
    ++got[key(t.tid, name, true)].untimed;
  }
  auto d = Diff(want, got);
  if (snap.counters.unpaired_exits != 0 || b.stats.unpaired_exits != 0) {
    // Userspace exits overwritten by the next: the same count on a trace with no kvm_exit.
    const uint64_t open = std::count_if(snap.threads.begin(), snap.threads.end(),
                                        [](const ks_thread& t) { return ks_sm_run_exit_open(&t); });
    if (snap.counters.unpaired_exits + open != b.stats.unpaired_exits) {
      d.push_back(fmt::format("unpaired exits: KvmPairer {} / kvm-run {} + {} open",
                              b.stats.unpaired_exits, snap.counters.unpaired_exits, open));
    }
  }
  return d;
}

std::string Lines(const std::vector<std::string>& v, size_t max = 20) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max; ++i) s += "  " + v[i] + "\n";
  if (v.size() > max) s += fmt::format("  ... and {} more\n", v.size() - max);
  return s;
}

// Every capture, read once for the whole suite.
const std::vector<Capture>& Captures() {
  static const std::vector<Capture> all = [] {
    std::vector<Capture> out;
    for (const fs::path p : CommittedDats()) {
      Capture c;
      std::string why;
      if (ReadCapture(p, &c, &why)) {
        out.push_back(std::move(c));
      } else {
        // testdata/crashes/ holds inputs the reader must refuse (fuzzer finds).
        fmt::print("[ skipped  ] {}: the reader refuses it: {}\n",
                   fs::relative(p, EXITSCOPE_TESTDATA_DIR).string(), why);
      }
    }
    return out;
  }();
  return all;
}

uint64_t Count(const std::vector<ExitEvent>& v, bool access) {
  return std::count_if(v.begin(), v.end(),
                       [&](const ExitEvent& e) { return e.kernel_access == access; });
}

TEST(BpfKvmPairSm, EveryCommittedDatIsRead) {
  // The real captures this suite is about: a reader change that drops one is a failure here,
  // not a quiet skip.
  std::vector<std::string> names;
  for (const Capture& c : Captures()) names.push_back(c.name);
  for (const char* want :
       {"kvm/pvm-user64-pio-mmio-hlt.dat", "kvm-host/joint-blk.dat", "kvm-host/joint-sched.dat"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
}

TEST(BpfKvmPairSm, EveryCommittedDatPairsAsKvmPairerPerKey) {
  for (const Capture& c : Captures()) {
    SCOPED_TRACE(c.name);
    // The replay is the read: the same records give the same exits.
    Both b;
    RunBoth(c, c.records, &b);
    EXPECT_EQ(b.stats.exits, c.read_stats.exits);
    EXPECT_EQ(b.stats.records_total, c.read_stats.records_total);
    EXPECT_EQ(c.read_stats.lost_markers, 0u) << "a capture with losses: replay them too";
    const auto d = PerKeyDifferences(b);
    EXPECT_TRUE(d.empty()) << d.size() << " keys differ:\n" << Lines(d);
    fmt::print(
        "[ compared ] {}: {} records, {} exits and {} kernel accesses ended in the trace, "
        "{} keys: {}\n",
        c.name, c.records.size(), Count(b.ended, false), Count(b.ended, true),
        PairerPerKey(b.ended).size(), d.empty() ? "all equal" : "DIFFER");
  }
}

TEST(BpfKvmPairSm, EveryCommittedDatGivesKvmReportsRowsAtTheEnd) {
  for (const Capture& c : Captures()) {
    SCOPED_TRACE(c.name);
    Both b;
    RunBoth(c, c.records, &b);
    const auto d = RowDifferences(b);
    EXPECT_TRUE(d.empty()) << d.size() << " differences:\n" << Lines(d);
    fmt::print(
        "[ compared ] {}: rows of every event class per vCPU, {} exits ({} open at end), "
        "pairing counters: {}\n",
        c.name, b.stats.exits, b.stats.open_at_end, d.empty() ? "all equal" : "DIFFER");
  }
}

TEST(BpfKvmPairSm, EveryCommittedDatTimesAsKvmPairerWithTheKvmRunPairing) {
  for (const Capture& c : Captures()) {
    SCOPED_TRACE(c.name);
    if (c.read_stats.records[static_cast<size_t>(KvmEventType::kExit)] != 0) {
      // The kvm-run pairing is only ever attached where kvm_exit never fires.
      fmt::print("[ skipped  ] {}: kvm-run pairing: the capture has kvm_exit records\n", c.name);
      continue;
    }
    Both b;
    RunBoth(c, c.records, &b);
    const auto d = KvmRunDifferences(c, b);
    EXPECT_TRUE(d.empty()) << d.size() << " differences:\n" << Lines(d);
    fmt::print("[ compared ] {}: kvm-run pairing, userspace exits per thread and reason: {}\n",
               c.name, d.empty() ? "all equal" : "DIFFER");
  }
}

// Records of one random run. The committed captures take the paths real guests take; these
// take the others (reads completed late, IN/OUT bytes, coalesced writes, unsatisfied MMIO
// reads, errors and restarts, kernel exits with every kind of child, lost ends), on
// `threads` vCPU threads interleaved. `vmx`: kvm_exit -> children -> kvm_entry blocks (a
// kvm_exit host, where nothing of a vCPU runs outside an exit but before its first one: see
// docs/kvm-bpf.md "Limits" for that case), with a thread that never shows a kvm_entry;
// else a kvm-pvm host, every record in any order but kvm_exit / kvm_entry.
Capture RandomCapture(uint64_t seed, bool vmx, int threads, int blocks) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  Capture c;
  c.name = fmt::format("random {} seed {}", vmx ? "vmx" : "pvm", seed);
  uint64_t ts = 1000;
  auto rec = [&](int th, KvmEventType type) {
    KvmRecord r;
    r.type = type;
    r.tid = 500 + th;
    r.tgid = 400;
    r.cpu = static_cast<uint32_t>(th);
    ts += 1 + rng() % 5000;
    r.ts = ts;
    if (vmx && (type == KvmEventType::kExit || type == KvmEventType::kEntry)) {
      r.vcpu_id = th == threads - 1 ? -1 : th;  // the last thread's records carry none
    }
    return r;
  };
  static constexpr uint16_t kPorts[] = {0x70, 0x71, 0x3f8};
  static constexpr uint64_t kGpas[] = {0xfebf1000, 0xfebf1008};
  static constexpr uint32_t kUserReasons[] = {2, 2, 2, 6, 6, 3, 5, 29, 31};
  // Each thread's vendor (1 VMX, 2 SVM, 3 PVM), in turn across seeds.
  auto isa_of = [&](int th) { return static_cast<uint32_t>(1 + (th + seed) % 3); };
  // One child record of kind `kind` (0-11: 0-5 accesses, 6-11 not), random when -1.
  auto child = [&](int th, int kind = -1) {
    KvmRecord r;
    switch (kind >= 0 ? kind : pick(12)) {
      case 0:
      case 1:
        r = rec(th, KvmEventType::kPio);
        r.write = static_cast<uint32_t>(pick(2));
        r.addr = kPorts[pick(3)];
        r.size = 1 + static_cast<uint32_t>(pick(2));
        break;
      case 2:
      case 3:
        r = rec(th, KvmEventType::kMmio);
        r.mmio_type = static_cast<uint32_t>(pick(3));
        r.write = r.mmio_type == kKvmMmioWrite;
        r.addr = kGpas[pick(2)];
        r.size = 4;
        break;
      case 4:
        r = rec(th, KvmEventType::kMsr);
        r.write = static_cast<uint32_t>(pick(2));
        r.addr = pick(2) ? 0x1b : 0xc0000080;
        break;
      case 5:
        r = rec(th, KvmEventType::kHypercall);
        r.addr = pick(2) ? 1 : 9;
        break;
      case 6:
      case 7: {
        r = rec(th, KvmEventType::kEmulateInsn);
        static constexpr std::array<uint8_t, 3> kInsns[] = {
            {0xec}, {0xee}, {0x66, 0xed}, {0xf3, 0x6e}, {0x89, 0x07}, {0x8b, 0x07}};
        const auto& i = kInsns[pick(6)];
        r.insn_len = static_cast<uint8_t>(pick(4) == 0 ? 0 : 3);
        std::copy(i.begin(), i.end(), r.insn.begin());
        r.guest_rip = 0x1000 + static_cast<uint64_t>(pick(16));
        break;
      }
      case 8:
        r = rec(th, KvmEventType::kVcpuMatchMmio);
        r.addr = kGpas[pick(2)];
        r.write = static_cast<uint32_t>(pick(2));
        break;
      case 9:
        r = rec(th, pick(2) ? KvmEventType::kPageFault : KvmEventType::kCpuid);
        break;
      case 10:
        r = rec(th, KvmEventType::kInjException);
        break;
      default:
        r = rec(th, KvmEventType::kFpu);
        r.write = static_cast<uint32_t>(pick(2));
        break;
    }
    c.records.push_back(r);
  };
  auto user_exit = [&](int th) {
    KvmRecord r = rec(th, KvmEventType::kUserspaceExit);
    r.reason = kUserReasons[pick(9)];
    r.err = pick(12) == 0 ? (pick(2) ? -4 : -22) : 0;
    c.records.push_back(r);
  };
  auto fpu = [&](int th, bool load) {
    KvmRecord r = rec(th, KvmEventType::kFpu);
    r.write = load;
    c.records.push_back(r);
  };
  // Each thread's first exit in thread order: vCPU numbers by first record (the program's)
  // and by first exit (KvmPairer's) agree then.
  for (int th = 0; th < threads; ++th) {
    if (vmx) {
      KvmRecord r = rec(th, KvmEventType::kExit);
      r.isa = isa_of(th);
      r.exit_reason = 12;
      c.records.push_back(r);
    } else {
      fpu(th, true);
      user_exit(th);
    }
  }
  for (int b = 0; b < blocks; ++b) {
    const int th = pick(threads);
    if (!vmx) {  // any order: a window's records, an exit, its end
      const int n = pick(6);
      for (int i = 0; i < n; ++i) child(th);
      if (pick(3) != 0) user_exit(th);
      if (pick(8) != 0) fpu(th, true);
      continue;
    }
    // A kernel exit of the thread's vendor: VMX IO (port, size and direction in info1), EPT
    // violation, HLT, VMCALL, RDMSR; SVM IOIO (the same in its info1), NPF, HLT, VMMCALL,
    // MSR; PVM HYPERCALL (its number in info2) and others.
    KvmRecord x = rec(th, KvmEventType::kExit);
    x.isa = isa_of(th);
    static constexpr uint32_t kReasons[3][6] = {{30, 30, 48, 12, 18, 31},
                                                {0x7b, 0x7b, 0x400, 0x78, 0x81, 0x7c},
                                                {0x20000, 0x20000, 12, 30, 48, 1}};
    x.exit_reason = kReasons[x.isa - 1][pick(6)];
    const uint64_t port = uint64_t{kPorts[pick(3)]} << 16;
    if (x.isa == 1 && x.exit_reason == 30) {
      x.info1 = port | static_cast<uint64_t>(pick(4)) | (pick(2) ? 8u : 0u);
    } else if (x.isa == 2 && x.exit_reason == 0x7b) {
      x.info1 = port | (0x10u << pick(3)) | static_cast<uint64_t>(pick(2));
    } else if (x.isa == 3 && x.exit_reason == 0x20000) {
      x.info2 = pick(2) ? 9 : 0x10003;
    }
    c.records.push_back(x);
    // What a kvm_exit host traces in one exit: at most one access (a kvm_pio, kvm_mmio,
    // kvm_msr or kvm_hypercall, a vcpu_match_mmio before an MMIO one), a read's completion
    // before the entry, records that are not accesses.
    const int access = pick(8);  // 0-5: that child, 6-7: none
    if (access == 2 && pick(2)) child(th, 8);
    if (access < 6) child(th, access);
    const KvmRecord first = c.records.back();
    const int n = pick(3);
    for (int i = 0; i < n; ++i) child(th, 6 + pick(6));
    if (pick(3) == 0) user_exit(th);
    if (access < 6 && pick(2) &&
        ((first.type == KvmEventType::kPio && !first.write) ||
         (first.type == KvmEventType::kMmio && first.mmio_type == kKvmMmioUnsatisfiedRead))) {
      KvmRecord r = first;  // the completion
      ts += 1 + rng() % 5000;
      r.ts = ts;
      r.mmio_type = first.type == KvmEventType::kMmio ? kKvmMmioRead : 0;
      r.data = 0x5a;
      c.records.push_back(r);
    }
    // The last thread never shows a kvm_entry (its exits have no time); others lose one now
    // and then (the next kvm_exit overwrites the exit) or show one twice.
    if (th != threads - 1 && pick(10) != 0) c.records.push_back(rec(th, KvmEventType::kEntry));
    if (th != threads - 1 && pick(20) == 0) c.records.push_back(rec(th, KvmEventType::kEntry));
  }
  // No run window is left open at the end: a window's reads and MSRs with no exit or kvm_fpu
  // load after them are the one difference by design (AnOpenWindowAtTheEndIsTheOneDifference).
  for (int th = 0; th < threads && !vmx; ++th) {
    if (pick(2)) {
      user_exit(th);  // open at the end
    } else {
      fpu(th, true);
    }
  }
  // read_stats: what the checks read of it (kvm_exit records decide the kvm-run check).
  KvmPairer p({}, nullptr);
  for (const KvmRecord& r : c.records) p.Feed(r);
  p.Finish();
  c.read_stats = p.stats();
  return c;
}

// Random runs on both kinds of host, each record fed to both sides: the same per-key samples,
// rows and counters; on kvm-pvm, the kvm-run pairing's times too.
TEST(BpfKvmPairSm, RandomRecordSequencesPairAsKvmPairer) {
  uint64_t exits = 0, accesses = 0, completions = 0, open = 0, kernel = 0, untimed = 0,
           unpaired = 0;
  for (const bool vmx : {false, true}) {
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      const Capture c = RandomCapture(seed, vmx, 3, 400);
      SCOPED_TRACE(c.name);
      Both b;
      RunBoth(c, c.records, &b);
      const auto k = PerKeyDifferences(b);
      EXPECT_TRUE(k.empty()) << k.size() << " keys differ:\n" << Lines(k);
      const auto r = RowDifferences(b);
      EXPECT_TRUE(r.empty()) << r.size() << " differences:\n" << Lines(r);
      if (!vmx) {
        const auto d = KvmRunDifferences(c, b);
        EXPECT_TRUE(d.empty()) << d.size() << " differences:\n" << Lines(d);
      }
      exits += b.stats.exits - b.stats.kernel_accesses;
      accesses += b.stats.kernel_accesses;
      completions += b.stats.completions;
      open += b.stats.open_at_end;
      kernel += b.stats.kernel_exits;
      untimed += b.stats.exits_time_unknown;
      unpaired += b.stats.unpaired_exits;
    }
  }
  // The runs take the paths they are for.
  EXPECT_GT(accesses, 0u);
  EXPECT_GT(completions, 0u);
  EXPECT_GT(open, 0u);
  EXPECT_GT(kernel, 0u);
  EXPECT_GT(untimed, 0u);
  EXPECT_GT(unpaired, 0u);
  fmt::print(
      "[ compared ] 80 random runs: {} exits ({} kernel exits, {} without time, {} "
      "unpaired), {} kernel accesses, {} completions, {} open at end\n",
      exits, kernel, untimed, unpaired, accesses, completions, open);
}

// kvm-pvm: a run window still open when the trace ends (accesses after the last kvm_fpu load,
// no exit after them). KvmPairer keeps the window whole and drops it at Finish() (counted in
// children_outside_exit); the program never keeps reads and MSRs (it cannot be an exit's own:
// counted as handled in the kernel when they come) and keeps only the last candidate of each
// kind (the maps' reader does not count those). The same holds of accesses before a thread's
// first kvm_exit on a kvm_exit host, which KvmPairer drops at that kvm_exit.
TEST(BpfKvmPairSm, AnOpenWindowAtTheEndIsTheOneDifference) {
  Capture c;
  c.name = "open window";
  auto rec = [&](KvmEventType type, uint64_t ts) {
    KvmRecord r;
    r.type = type;
    r.tid = 7;
    r.ts = ts;
    return r;
  };
  KvmRecord r = rec(KvmEventType::kFpu, 100);
  r.write = 1;
  c.records.push_back(r);
  r = rec(KvmEventType::kMmio, 200);  // a read: never an exit's own
  r.mmio_type = kKvmMmioRead;
  r.addr = 0xfebf1000;
  r.size = 4;
  c.records.push_back(r);
  r = rec(KvmEventType::kMsr, 300);
  r.write = 1;
  r.addr = 0x1b;
  c.records.push_back(r);
  r = rec(KvmEventType::kPio, 400);  // a write: the next exit's, if one came
  r.write = 1;
  r.addr = 0x3f8;
  r.size = 1;
  c.records.push_back(r);
  Both b;
  RunBoth(c, c.records, &b);
  EXPECT_EQ(b.stats.kernel_accesses, 0u);
  EXPECT_EQ(b.stats.children_outside_exit, 3u);
  const BpfKvmRows rows = BuildBpfKvmRows(b.prog.Snapshot(), {.final = true});
  EXPECT_EQ(rows.pairing.kernel_accesses, 2u);  // the read and the MSR
  std::vector<std::string> keys;
  for (const auto& [k, a] : SmPerKey(b.prog.Snapshot())) keys.push_back(k);
  EXPECT_EQ(keys.size(), 2u);
  EXPECT_EQ(b.prog.threads.at(7).cand_pio.key, 0x3f8u);  // held, counted by neither
  // Closed by a kvm_fpu load, the window is counted alike.
  r = rec(KvmEventType::kFpu, 500);
  r.write = 1;
  c.records.push_back(r);
  Both closed;
  RunBoth(c, c.records, &closed);
  EXPECT_EQ(closed.stats.kernel_accesses, 3u);
  EXPECT_TRUE(PerKeyDifferences(closed).empty());
  EXPECT_TRUE(RowDifferences(closed).empty());
}

// C11, as the BPF program is written (clang -target bpf), and C++ make the same state
// machine of the header: on every capture and random run, the same maps and threads.
TEST(BpfKvmPairSm, CompiledAsC11ItCountsAsCompiledAsCpp) {
  std::vector<Capture> all(Captures().begin(), Captures().end());
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    all.push_back(RandomCapture(seed, false, 3, 400));
    all.push_back(RandomCapture(seed, true, 3, 400));
  }
  for (const Capture& c : all) {
    SCOPED_TRACE(c.name);
    Program cpp, c11;
    RunTracepointPairing(c, c.records, &cpp);
    RunTracepointPairing(c, c.records, &c11, &ks_c11_record);
    ASSERT_EQ(cpp.maps.slots.size(), c11.maps.slots.size());
    EXPECT_TRUE(std::equal(cpp.maps.slots.begin(), cpp.maps.slots.end(), c11.maps.slots.begin(),
                           [](const auto& a, const auto& b) {
                             return std::memcmp(&a.first, &b.first, sizeof a.first) == 0 &&
                                    std::memcmp(&a.second.stats, &b.second.stats,
                                                sizeof(ks_stats)) == 0 &&
                                    a.second.buckets == b.second.buckets;
                           }));
    EXPECT_EQ(std::memcmp(&cpp.maps.counters, &c11.maps.counters, sizeof(ks_counters)), 0);
    ASSERT_EQ(cpp.threads.size(), c11.threads.size());
    for (const auto& [tid, t] : cpp.threads) {
      EXPECT_EQ(std::memcmp(&t, &c11.threads.at(tid), sizeof(ks_thread)), 0) << "thread " << tid;
    }
    EXPECT_FALSE(cpp.maps.slots.empty());
  }
}

// The checks can fail: a record the program would miss (one kvm_fpu load of the longest
// capture left out of the state machine's input only) is seen as a difference by each.
TEST(BpfKvmPairSm, AMissedRecordIsADifference) {
  const Capture* big = nullptr;
  for (const Capture& c : Captures()) {
    if (big == nullptr || c.records.size() > big->records.size()) big = &c;
  }
  ASSERT_NE(big, nullptr);
  std::vector<KvmRecord> less = big->records;
  auto load =
      std::find_if(less.begin() + static_cast<ptrdiff_t>(less.size() / 2), less.end(),
                   [](const KvmRecord& r) { return r.type == KvmEventType::kFpu && r.write == 1; });
  ASSERT_NE(load, less.end());
  less.erase(load);
  Both b;
  RunBoth(*big, less, &b);
  EXPECT_FALSE(PerKeyDifferences(b).empty());
  EXPECT_FALSE(RowDifferences(b).empty());
  Capture fewer = *big;
  fewer.records = less;
  Both full;
  RunBoth(*big, big->records, &full);
  EXPECT_FALSE(KvmRunDifferences(fewer, full).empty());
}

}  // namespace
}  // namespace exitscope::sources::bpf
