#include "analysis/bpf_kvm_rows.h"

#include <algorithm>
#include <deque>
#include <string>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

namespace exitscope::analysis {

using namespace sources;       // the decode tables and the pairer's terms
using namespace sources::bpf;  // the maps' ABI (kvm_stat_abi.h)

namespace {

// The event model's access direction (kNone, kRead, kWrite: KS_DIR_* in that order).
using Dir = decltype(ExitEvent{}.dir);

std::string_view AccessReason(uint8_t kind) noexcept {
  switch (kind) {
    case KS_SUB_PORT:
      return "PIO";
    case KS_SUB_MMIO:
      return "MMIO";
    case KS_SUB_MSR:
      return "MSR";
    case KS_SUB_HYPERCALL:
      return "HYPERCALL";
    default:
      return "ACCESS";
  }
}

// Map keys as the event model's exits: the decoding is this file's, the rows are
// KvmAggregator's (the one analysis `kvm report` uses).
class EventDecoder {
 public:
  explicit EventDecoder(const BpfKvmRowOptions& o) : o_(o) {}

  // The exit a key stands for (duration left 0).
  ExitEvent EventOf(const ks_key& k, uint32_t vcpu) {
    ExitEvent e;
    e.vm = k.tgid;
    e.tid = k.tid;
    e.vcpu = vcpu;
    e.subkey_kind =
        static_cast<exitscope::SubKeyKind>(k.subkind <= KS_SUB_HYPERCALL ? k.subkind : 0);
    e.subkey = k.subkey;
    e.dir = static_cast<Dir>(k.dir <= KS_DIR_WRITE ? k.dir : 0);
    e.size = k.size;
    e.end = (k.flags & KS_F_NOT_TRACED) ? ExitEnd::kNotTraced : ExitEnd::kSeen;
    if (k.flags & KS_F_KERNEL_ACCESS) {
      e.reason = AccessReason(k.subkind);
      e.kernel_access = true;
    }
    if (k.flags & KS_F_KERNEL_EXIT) {
      const ExitReason r = DecodeExitReason(k.exit_reason, k.isa, k.aux, o_.pvm);
      e.isa = static_cast<Isa>(k.isa <= 3 ? k.isa : 0);
      e.reason = r.known ? r.name
                         : Intern(fmt::format("UNKNOWN({}:{:#x})", ToString(e.isa), k.exit_reason));
      e.failed_vmentry = r.failed_vmentry;
    }
    if (k.flags & KS_F_USERSPACE) {
      std::string_view name = k.user_err < 0 ? (k.user_err == -4 ? "restart" : "error")
                                             : UserspaceExitName(k.user_reason);
      if (name.empty()) name = Intern(fmt::format("KVM_EXIT_{}", k.user_reason));
      e.userspace = true;
      e.user_reason = name;
      if (!(k.flags & KS_F_KERNEL_EXIT)) e.reason = name;
    }
    if (o_.devices != nullptr &&
        (e.subkey_kind == SubKeyKind::kPort || e.subkey_kind == SubKeyKind::kMmio)) {
      std::string_view dev, reg;
      if (o_.devices->Resolve(e.subkey_kind, e.subkey, e.size, e.dir, &dev, &reg)) {
        e.device = dev;
        e.reg = reg;
      }
    }
    return e;
  }

 private:
  std::string_view Intern(std::string s) {
    interned_.push_back(std::move(s));
    return interned_.back();
  }

  const BpfKvmRowOptions& o_;
  std::deque<std::string> interned_;  // reason names the views of ExitEvents point at
};

// vCPU numbers as KvmPairer gives them: the thread's vcpu_id when a record carried one, else
// its index among its VM's threads in the order they were first seen.
std::unordered_map<uint32_t, uint32_t> VcpuNumbers(const BpfKvmSnapshot& snap) {
  std::vector<const ks_thread*> order;
  for (const ks_thread& t : snap.threads) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const ks_thread* a, const ks_thread* b) {
    return std::tie(a->first_ts, a->tid) < std::tie(b->first_ts, b->tid);
  });
  std::unordered_map<uint32_t, uint32_t> next, out;
  for (const ks_thread* t : order) {
    if (t->vcpu >= 0)
      out[t->tid] = static_cast<uint32_t>(t->vcpu);
    else
      out[t->tid] = next[t->tgid]++;
  }
  return out;
}

}  // namespace

void ForEachBpfKvmExit(const BpfKvmSnapshot& snap, const BpfKvmRowOptions& options,
                       const std::function<void(const ExitEvent&, const BpfKvmSample&)>& fn) {
  EventDecoder d(options);
  const auto vcpus = VcpuNumbers(snap);
  for (const BpfKvmSample& s : snap.samples) {
    uint32_t vcpu = 0;
    if (s.key.vcpu >= 0) {
      vcpu = static_cast<uint32_t>(s.key.vcpu);
    } else if (auto it = vcpus.find(s.key.tid); it != vcpus.end()) {
      vcpu = it->second;
    }
    fn(d.EventOf(s.key, vcpu), s);
  }
}

BpfKvmRows BuildBpfKvmRows(const BpfKvmSnapshot& snap, const BpfKvmRowOptions& options) {
  BpfKvmRows out;
  EventDecoder d(options);
  analysis::KvmAnalysisOptions aopts = options.analysis;
  aopts.slow_ns = 0;  // no single exits here
  aopts.on_slow = nullptr;
  analysis::KvmAggregator agg(std::move(aopts));
  EventSink& sink = agg;  // the maps' aggregates arrive as any source's events do
  const auto vcpus = VcpuNumbers(snap);
  auto vcpu_of = [&](const ks_key& k) -> uint32_t {
    if (k.vcpu >= 0) return static_cast<uint32_t>(k.vcpu);
    auto it = vcpus.find(k.tid);
    return it != vcpus.end() ? it->second : 0;
  };
  KvmPairingStats& p = out.pairing;
  for (int e = 0; e < KS_EV_COUNT; ++e) {
    p.records[static_cast<size_t>(e) + 1] = snap.counters.records[e];  // KvmEventType order
    p.records_total += snap.counters.records[e];
  }
  p.completions = snap.counters.completions;
  p.unpaired_exits = snap.counters.unpaired_exits;
  p.entries_without_exit = snap.counters.entries_without_exit;
  p.children_outside_exit = snap.counters.children_outside_exit;
  out.lost_samples = snap.counters.keys_full;
  out.lost_records = snap.counters.threads_full;
  p.lost_events = out.lost_records;

  auto count_exit = [&](const ExitEvent& e, uint64_t timed, uint64_t untimed) {
    p.exits += timed + untimed;
    if (e.kernel_access) {
      p.kernel_accesses += timed + untimed;
      return;
    }
    p.exits_time_unknown += untimed;
    if (e.isa != Isa::kUnknown) p.kernel_exits += timed;
    if (e.userspace) p.userspace_exits += timed;
  };

  for (const BpfKvmSample& s : snap.samples) {
    ++out.keys;
    const ExitEvent e = d.EventOf(s.key, vcpu_of(s.key));
    count_exit(e, s.stats.timed, s.stats.untimed);
    sink.OnSamples(e, s.batch());
    if (options.also != nullptr) options.also->OnSamples(e, s.batch());
  }

  // What the threads hold, placed as KvmPairer::Finish() would.
  for (const ks_thread& t : snap.threads) {
    if (t.held != KS_HOLD_NONE) {  // an ended exit waiting for its completion: timed
      ks_key k = t.held_ev;
      if (t.held == KS_HOLD_PIO_MAYBE) {
        k.subkind = t.candidate.kind;
        k.subkey = t.candidate.key;
        k.size = t.candidate.size;
        k.dir = t.candidate.dir;
      }
      k.tgid = t.tgid;
      k.tid = t.tid;
      k.vcpu = t.vcpu;
      ExitEvent e = d.EventOf(k, vcpu_of(k));
      count_exit(e, 1, 0);
      e.end = ExitEnd::kSeen;
      e.duration_ns = t.held_dur;
      agg.OnExit(e);
    }
    // Idle, or (kvm-run pairing) KVM_RUN is returning but kvm_userspace_exit has not come
    // yet: no exit has started that the VMM could see.
    if (t.phase == KS_IDLE || (t.phase == KS_USER_EXIT && t.exit_ts == 0)) continue;
    ks_key k = t.ev;
    k.tgid = t.tgid;
    k.tid = t.tid;
    k.vcpu = t.vcpu;
    if (t.ev_is_kernel && t.child.kind != KS_SUB_NONE &&
        !(k.subkind == KS_SUB_HYPERCALL && t.child.kind == KS_SUB_HYPERCALL)) {
      k.subkind = t.child.kind;  // KvmPairer::ApplyChild
      k.subkey = t.child.key;
      k.size = t.child.size;
      k.dir = t.child.dir;
    }
    if (t.ev_is_kernel && !t.seen_entry) {  // no kvm_entry on this thread: no time
      if (options.final) {
        k.flags |= KS_F_NOT_TRACED;
        const ExitEvent e = d.EventOf(k, vcpu_of(k));
        count_exit(e, 0, 1);
        agg.OnExit(e);
      }
      continue;
    }
    ExitEvent e = d.EventOf(k, vcpu_of(k));
    e.start_ns = t.exit_ts;
    e.end = ExitEnd::kOpenAtEnd;
    std::string key;
    if (!agg.RowKeyText(e, &key)) {
      if (options.final) agg.OnExit(e);  // counted as filtered
      continue;
    }
    out.in_flight.push_back(
        {KeptExit(e, std::move(key)), snap.now_ns > t.exit_ts ? snap.now_ns - t.exit_ts : 0});
    if (options.final) {
      ++p.exits;
      ++p.open_at_end;
      ++p.unpaired_exits;
      agg.OnExit(e);  // open at end of trace
    }
  }
  agg.Finish();
  out.analysis = agg.TakeAnalysis();
  return out;
}

}  // namespace exitscope::analysis
