#include "sources/bpf/bpf_kvm_rows.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

namespace exitscope::sources::bpf {
namespace {

using analysis::KvmEventClass;
using analysis::KvmGroup;
using analysis::KvmRow;
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

// The aggregator's row identity (KvmAggregator::Key), by value.
struct RowKey {
  std::string name;
  uint64_t sub = 0;
  uint8_t dir = 0;
  bool operator<(const RowKey& o) const {
    return std::tie(name, sub, dir) < std::tie(o.name, o.sub, o.dir);
  }
};

class RowBuilder {
 public:
  RowBuilder(const BpfKvmRowOptions& o, BpfKvmRows* out) : o_(o), out_(out) {
    out_->analysis.event = o.analysis.event;
    all_.group = &out_->analysis.all;
  }

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

  // KvmAggregator::Classify.
  bool Classify(const ExitEvent& e, RowKey* key) const {
    switch (o_.analysis.event) {
      case KvmEventClass::kVmexit:
        key->name = e.reason;
        return true;
      case KvmEventClass::kUserspace:
        if (!e.userspace) return false;
        key->name = e.user_reason.empty() ? e.reason : e.user_reason;
        return true;
      case KvmEventClass::kIoport:
        if (e.subkey_kind != SubKeyKind::kPort) return false;
        break;
      case KvmEventClass::kMmio:
        if (e.subkey_kind != SubKeyKind::kMmio) return false;
        break;
      case KvmEventClass::kMsr:
        if (e.subkey_kind != SubKeyKind::kMsr) return false;
        break;
      case KvmEventClass::kHypercall:
        if (e.reason.starts_with("HC_")) {
          key->name = e.reason;
          return true;
        }
        if (e.subkey_kind != SubKeyKind::kHypercall) return false;
        key->sub = e.subkey;
        return true;
    }
    key->sub = e.subkey;
    key->dir = static_cast<uint8_t>(e.dir);
    return true;
  }

  // KvmAggregator::KeyText / NameText.
  std::string KeyText(const RowKey& key) const {
    const bool write = key.dir == static_cast<uint8_t>(Dir::kWrite);
    switch (o_.analysis.event) {
      case KvmEventClass::kVmexit:
      case KvmEventClass::kUserspace:
        return key.name;
      case KvmEventClass::kIoport:
        return fmt::format("{:#x}:{}", key.sub, write ? "POUT" : "PIN");
      case KvmEventClass::kMmio:
      case KvmEventClass::kMsr:
        return fmt::format("{:#x}:{}", key.sub, write ? "W" : "R");
      case KvmEventClass::kHypercall:
        if (!key.name.empty()) return key.name;
        return fmt::format("nr {:#x}", key.sub);
    }
    return {};
  }
  std::string NameText(const ExitEvent& e) const {
    switch (o_.analysis.event) {
      case KvmEventClass::kIoport:
      case KvmEventClass::kMmio:
        if (e.device.empty()) return {};
        return e.reg.empty() ? std::string(e.device) : fmt::format("{}.{}", e.device, e.reg);
      case KvmEventClass::kMsr:
        return std::string(MsrName(static_cast<uint32_t>(e.subkey)));
      case KvmEventClass::kHypercall:
        if (e.reason.starts_with("HC_")) return {};
        return std::string(e.reason);
      default:
        return {};
    }
  }

  // Filters as KvmAggregator::OnExit; true when the exit belongs in the rows.
  bool Keep(const ExitEvent& e, RowKey* key, uint64_t n) {
    const bool exit_class = o_.analysis.event == KvmEventClass::kVmexit ||
                            o_.analysis.event == KvmEventClass::kUserspace;
    const int64_t pid = o_.analysis.pid;
    const bool keep = !(e.kernel_access && exit_class) && Classify(e, key) &&
                      !(o_.analysis.vcpu >= 0 && e.vcpu != o_.analysis.vcpu) &&
                      !(pid >= 0 && e.vm != pid && e.tid != pid);
    auto& a = out_->analysis;
    if (e.kernel_access) {
      a.kernel_accesses_seen += n;
      if (!keep) a.kernel_accesses_skipped += n;
    } else {
      a.exits_seen += n;
      if (!keep) a.exits_filtered += n;
    }
    return keep;
  }

  // Adds samples of one exit key: timed ones from `merge` (stats + buckets) or `one` (a
  // single duration), and `untimed` without time.
  void Add(const ExitEvent& e, const RowKey& key, const BpfKvmSample* merge, const uint64_t* one,
           uint64_t untimed) {
    AddTo(all_, e, key, merge, one, untimed);
    if (o_.analysis.per_vm) AddTo(Vm(e.vm), e, key, merge, one, untimed);
    if (o_.analysis.per_vcpu) AddTo(Vcpu(e.vm, e.vcpu), e, key, merge, one, untimed);
  }

  void Finish() {
    auto by_scope = [](const std::unique_ptr<KvmGroup>& a, const std::unique_ptr<KvmGroup>& b) {
      return std::pair(a->vm, a->vcpu) < std::pair(b->vm, b->vcpu);
    };
    std::sort(out_->analysis.per_vm.begin(), out_->analysis.per_vm.end(), by_scope);
    std::sort(out_->analysis.per_vcpu.begin(), out_->analysis.per_vcpu.end(), by_scope);
  }

 private:
  struct GroupIndex {
    KvmGroup* group = nullptr;
    std::map<RowKey, KvmRow*> rows;
  };

  void AddTo(GroupIndex& gi, const ExitEvent& e, const RowKey& key, const BpfKvmSample* merge,
             const uint64_t* one, uint64_t untimed) {
    auto it = gi.rows.find(key);
    if (it == gi.rows.end()) {
      auto row = std::make_unique<KvmRow>();
      row->key = KeyText(key);
      row->name = NameText(e);
      it = gi.rows.emplace(key, row.get()).first;
      gi.group->rows.push_back(std::move(row));
    }
    KvmRow& row = *it->second;
    KvmGroup& g = *gi.group;
    uint64_t timed = 0, time_ns = 0;
    if (merge != nullptr && merge->stats.timed != 0) {
      const uint64_t before = row.stats.count();
      row.stats.MergeBuckets(merge->buckets, merge->stats.sum, merge->stats.min, merge->stats.max,
                             merge->sum_squares());
      timed = row.stats.count() - before;
      time_ns = merge->stats.sum;
    }
    if (one != nullptr) {
      row.stats.Add(*one);
      timed += 1;
      time_ns += *one;
    }
    const uint64_t n = timed + untimed;
    g.samples += n;
    g.time_ns += time_ns;
    row.untimed += untimed;
    g.untimed += untimed;
    if (e.kernel_access || !e.userspace) {
      row.in_kernel += n;
      g.in_kernel += n;
    }
  }
  GroupIndex& Vm(int64_t vm) {
    auto [it, inserted] = vm_groups_.try_emplace(vm);
    if (inserted) {
      out_->analysis.per_vm.push_back(std::make_unique<KvmGroup>());
      it->second.group = out_->analysis.per_vm.back().get();
      it->second.group->vm = vm;
    }
    return it->second;
  }
  GroupIndex& Vcpu(int64_t vm, int64_t vcpu) {
    auto [it, inserted] = vcpu_groups_.try_emplace({vm, vcpu});
    if (inserted) {
      out_->analysis.per_vcpu.push_back(std::make_unique<KvmGroup>());
      it->second.group = out_->analysis.per_vcpu.back().get();
      it->second.group->vm = vm;
      it->second.group->vcpu = vcpu;
    }
    return it->second;
  }
  std::string_view Intern(std::string s) {
    interned_.push_back(std::move(s));
    return interned_.back();
  }

  const BpfKvmRowOptions& o_;
  BpfKvmRows* out_;
  GroupIndex all_;
  std::map<int64_t, GroupIndex> vm_groups_;
  std::map<std::pair<int64_t, int64_t>, GroupIndex> vcpu_groups_;
  std::deque<std::string> interned_;
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

BpfKvmRows BuildBpfKvmRows(const BpfKvmSnapshot& snap, const BpfKvmRowOptions& options) {
  BpfKvmRows out;
  RowBuilder b(options, &out);
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
    const ExitEvent e = b.EventOf(s.key, vcpu_of(s.key));
    count_exit(e, s.stats.timed, s.stats.untimed);
    RowKey key;
    if (!b.Keep(e, &key, s.stats.timed + s.stats.untimed)) continue;
    b.Add(e, key, &s, nullptr, s.stats.untimed);
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
      const ExitEvent e = b.EventOf(k, vcpu_of(k));
      count_exit(e, 1, 0);
      RowKey key;
      const uint64_t dur = t.held_dur;
      if (b.Keep(e, &key, 1)) b.Add(e, key, nullptr, &dur, 0);
    }
    if (t.phase == KS_IDLE) continue;
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
        const ExitEvent e = b.EventOf(k, vcpu_of(k));
        count_exit(e, 0, 1);
        RowKey key;
        if (b.Keep(e, &key, 1)) b.Add(e, key, nullptr, nullptr, 1);
      }
      continue;
    }
    ExitEvent e = b.EventOf(k, vcpu_of(k));
    e.start_ns = t.exit_ts;
    e.end = ExitEnd::kOpenAtEnd;
    RowKey key;
    if (!b.Keep(e, &key, 1)) continue;
    analysis::KvmOpenExit open{e.start_ns,
                               e.vm,
                               e.vcpu,
                               e.tid,
                               std::string(e.reason),
                               b.KeyText(key),
                               std::string(e.device),
                               std::string(e.reg)};
    out.in_flight.push_back({open, snap.now_ns > t.exit_ts ? snap.now_ns - t.exit_ts : 0});
    if (options.final) {
      ++p.exits;
      ++p.open_at_end;
      ++p.unpaired_exits;
      ++out.analysis.open_at_end;
      if (out.analysis.open_exits.size() < analysis::KvmAnalysis::kMaxOpenExitsKept) {
        out.analysis.open_exits.push_back(std::move(open));
      }
    }
  }
  b.Finish();
  return out;
}

}  // namespace exitscope::sources::bpf
