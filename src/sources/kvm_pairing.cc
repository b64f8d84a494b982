#include "sources/kvm_pairing.h"

#include <fmt/format.h>

#include <utility>

namespace exitscope::sources {
namespace {

bool IsChild(KvmEventType t) noexcept {
  switch (t) {
    case KvmEventType::kPio:
    case KvmEventType::kMmio:
    case KvmEventType::kMsr:
    case KvmEventType::kHypercall:
    case KvmEventType::kEmulateInsn:
    case KvmEventType::kVcpuMatchMmio:
    case KvmEventType::kPageFault:
    case KvmEventType::kInjException:
    case KvmEventType::kCpuid:
      return true;
    default:
      return false;
  }
}

// A held exit is a read whose value (and, for PIO IN, whose port) comes with the completion
// record KVM fires after re-entry.
bool NeedsCompletion(const ExitEvent& e) noexcept {
  if (!e.userspace) return false;
  if (e.subkey_kind == SubKeyKind::kMmio) return e.dir == Direction::kRead;
  if (e.user_reason == "IO") return e.subkey_kind == SubKeyKind::kNone || e.dir == Direction::kRead;
  return false;
}

// Records that may sit between re-entry and a read's completion without ending the wait.
bool KeepsHold(KvmEventType t) noexcept {
  return t == KvmEventType::kFpu || t == KvmEventType::kEmulateInsn ||
         t == KvmEventType::kVcpuMatchMmio || t == KvmEventType::kEntry;
}

}  // namespace

KvmPairer::KvmPairer(KvmPairerOptions options, EventSink* sink) : options_(options), sink_(sink) {}

void KvmPairer::SetThreadGroup(int32_t tid, int32_t tgid) {
  tgid_of_[tid] = tgid;
  if (auto it = threads_.find(tid); it != threads_.end()) it->second.tgid = tgid;
}

std::string_view KvmPairer::Intern(std::string s) {
  if (auto it = interned_index_.find(s); it != interned_index_.end()) return it->second;
  interned_.push_back(s);
  std::string_view v = interned_.back();
  interned_index_.emplace(std::move(s), v);
  return v;
}

KvmPairer::Thread& KvmPairer::ThreadOf(const KvmRecord& r) {
  if (last_thread_ != nullptr && last_tid_ == r.tid) {  // runs of one thread are the norm
    if (r.tgid >= 0) last_thread_->tgid = r.tgid;
    last_thread_->last_cpu = r.cpu;
    return *last_thread_;
  }
  auto [it, inserted] = threads_.try_emplace(r.tid);
  Thread& t = it->second;
  last_thread_ = &t;  // unordered_map nodes never move
  last_tid_ = r.tid;
  if (inserted) {
    if (auto g = tgid_of_.find(r.tid); g != tgid_of_.end()) t.tgid = g->second;
  }
  if (r.tgid >= 0) t.tgid = r.tgid;
  t.last_cpu = r.cpu;
  return t;
}

uint32_t KvmPairer::VcpuOf(int32_t tid, const Thread& t) {
  if (t.vcpu >= 0) return static_cast<uint32_t>(t.vcpu);
  if (t.vcpu_index >= 0) return static_cast<uint32_t>(t.vcpu_index);
  if (auto it = vcpu_of_tid_.find(tid); it != vcpu_of_tid_.end()) {
    t.vcpu_index = it->second;
    return it->second;
  }
  const int32_t vm = t.tgid >= 0 ? t.tgid : tid;
  const uint32_t v = next_vcpu_[vm]++;
  vcpu_of_tid_.emplace(tid, v);
  t.vcpu_index = v;
  return v;
}

void KvmPairer::AddChild(Thread& t, const KvmRecord& r) {
  Child& c = t.child;
  switch (r.type) {
    case KvmEventType::kPio:
      if (r.write == 0 && c.kind == SubKeyKind::kPort && c.key == r.addr &&
          c.dir == Direction::kRead) {
        c.value = r.data;  // completion of an IN handled before kvm_entry
        break;
      }
      c.kind = SubKeyKind::kPort;
      c.key = r.addr;
      c.size = static_cast<uint8_t>(r.size);
      c.dir = r.write ? Direction::kWrite : Direction::kRead;
      c.value = r.data;
      break;
    case KvmEventType::kMmio:
      if (r.mmio_type == kKvmMmioRead && c.kind == SubKeyKind::kMmio && c.key == r.addr) {
        c.value = r.data;  // completion of an unsatisfied read
        break;
      }
      c.kind = SubKeyKind::kMmio;
      c.key = r.addr;
      c.size = static_cast<uint8_t>(r.size);
      c.dir = r.mmio_type == kKvmMmioWrite ? Direction::kWrite : Direction::kRead;
      c.value = r.data;
      break;
    case KvmEventType::kVcpuMatchMmio:
      if (c.kind == SubKeyKind::kNone) {
        c.kind = SubKeyKind::kMmio;
        c.key = r.addr;
        c.dir = r.write ? Direction::kWrite : Direction::kRead;
      }
      break;
    case KvmEventType::kMsr:
      c.kind = SubKeyKind::kMsr;
      c.key = r.addr;
      c.size = 8;
      c.dir = r.write ? Direction::kWrite : Direction::kRead;
      c.value = r.data;
      break;
    case KvmEventType::kHypercall:
      c.kind = SubKeyKind::kHypercall;
      c.key = r.addr;
      c.dir = Direction::kNone;
      break;
    case KvmEventType::kEmulateInsn:
      c.rip = r.guest_rip;
      break;
    case KvmEventType::kPageFault:
      if (r.vcpu_id >= 0) t.vcpu = r.vcpu_id;
      if (c.rip == 0) c.rip = r.guest_rip;
      break;
    default:
      break;
  }
  ++t.children;
}

void KvmPairer::ApplyChild(const Thread& t, ExitEvent* e) const {
  const Child& c = t.child;
  if (c.rip != 0 && e->guest_rip == 0) e->guest_rip = c.rip;
  if (c.kind == SubKeyKind::kNone) return;
  // A PVM hypercall number from the exit record itself wins over a kvm_hypercall child.
  if (e->subkey_kind == SubKeyKind::kHypercall && c.kind == SubKeyKind::kHypercall) return;
  e->subkey_kind = c.kind;
  e->subkey = c.key;
  e->size = c.size;
  e->dir = c.dir;
  e->value = c.value;
}

void KvmPairer::Resolve(ExitEvent* e) const {
  if (options_.devices == nullptr) return;
  if (e->subkey_kind != SubKeyKind::kPort && e->subkey_kind != SubKeyKind::kMmio) return;
  std::string_view dev, reg;
  if (options_.devices->Resolve(e->subkey_kind, e->subkey, e->size, e->dir, &dev, &reg)) {
    e->device = dev;
    e->reg = reg;
  } else {
    e->device = {};
    e->reg = {};
  }
}

void KvmPairer::StartKernelExit(Thread& t, const KvmRecord& r) {
  ExitEvent& e = t.ev;
  e = ExitEvent{};
  t.exit_ts = r.ts;
  t.ev_is_kernel = true;
  t.phase = Phase::kKernelExit;
  t.children = 0;
  t.child = Child{};
  if (r.vcpu_id >= 0) t.vcpu = r.vcpu_id;
  const ExitReason reason = DecodeExitReason(r.exit_reason, r.isa, r.info2, options_.pvm);
  e.isa = static_cast<Isa>(r.isa <= 3 ? r.isa : 0);
  if (reason.known) {
    e.reason = reason.name;
  } else {
    e.reason = Intern(fmt::format("UNKNOWN({}:{:#x})", ToString(e.isa), r.exit_reason));
  }
  e.failed_vmentry = reason.failed_vmentry;
  e.guest_rip = r.guest_rip;
  if (reason.hypercall_nr >= 0) {
    e.subkey_kind = SubKeyKind::kHypercall;
    e.subkey = static_cast<uint64_t>(reason.hypercall_nr);
  } else if (reason.io) {
    // Exit qualification / EXITINFO1 carries the port; a kvm_pio child may refine it.
    if (e.isa == Isa::kVmx) {
      e.subkey_kind = SubKeyKind::kPort;
      e.subkey = (r.info1 >> 16) & 0xffff;
      e.size = static_cast<uint8_t>((r.info1 & 7) + 1);
      e.dir = (r.info1 & 8) ? Direction::kRead : Direction::kWrite;
    } else if (e.isa == Isa::kSvm) {
      e.subkey_kind = SubKeyKind::kPort;
      e.subkey = (r.info1 >> 16) & 0xffff;
      e.size = (r.info1 & 0x10) ? 1 : (r.info1 & 0x20) ? 2 : (r.info1 & 0x40) ? 4 : 0;
      e.dir = (r.info1 & 1) ? Direction::kRead : Direction::kWrite;
    }
  }
}

void KvmPairer::StartUserExit(Thread& t, const KvmRecord& r) {
  ExitEvent& e = t.ev;
  e = ExitEvent{};
  t.exit_ts = r.ts;
  t.ev_is_kernel = false;
  t.phase = Phase::kUserExit;
  e.userspace = true;
  std::string_view name =
      r.err < 0 ? (r.err == -4 ? "restart" : "error") : UserspaceExitName(r.reason);
  if (name.empty()) name = Intern(fmt::format("KVM_EXIT_{}", r.reason));
  e.user_reason = name;
  e.reason = name;
  ApplyChild(t, &e);  // the children came before kvm_userspace_exit
  t.children = 0;
  t.child = Child{};
}

void KvmPairer::EndExit(Thread& t, uint64_t end_ts) {
  ExitEvent& e = t.ev;
  if (t.ev_is_kernel) ApplyChild(t, &e);
  const uint64_t start = options_.clock.ToNs(t.exit_ts);
  const uint64_t end = options_.clock.ToNs(end_ts);
  e.start_ns = start;
  e.duration_ns = end > start ? end - start : 0;
  t.phase = Phase::kIdle;
  t.children = 0;
  t.child = Child{};
  if (!t.ev_is_kernel && NeedsCompletion(e)) {
    t.held = true;
    t.held_ev = e;
    return;
  }
  Emit(e, t.ev_is_kernel);
}

void KvmPairer::FlushHeld(Thread& t) {
  if (!t.held) return;
  t.held = false;
  Emit(t.held_ev, false);
}

void KvmPairer::Emit(const ExitEvent& e_in, bool kernel) {
  ExitEvent e = e_in;
  Resolve(&e);
  ++stats_.exits;
  if (kernel) ++stats_.kernel_exits;
  if (e.userspace) ++stats_.userspace_exits;
  if (e.failed_vmentry) ++stats_.failed_vmentry;
  if (sink_ != nullptr) sink_->OnExit(e);
}

void KvmPairer::Feed(const KvmRecord& r) {
  if (observer_ != nullptr) observer_(r, observer_ctx_);
  ++stats_.records_total;
  ++stats_.records[static_cast<size_t>(r.type) < kKvmEventTypeCount ? static_cast<size_t>(r.type)
                                                                    : 0];
  if (r.type == KvmEventType::kOther || r.type == KvmEventType::kCount) return;
  Thread& t = ThreadOf(r);
  if (r.vcpu_id >= 0 && (r.type == KvmEventType::kExit || r.type == KvmEventType::kEntry ||
                         r.type == KvmEventType::kPageFault)) {
    t.vcpu = r.vcpu_id;
  }

  if (t.held) {
    ExitEvent& h = t.held_ev;
    const bool pio_done = r.type == KvmEventType::kPio && r.write == 0 &&
                          (h.subkey_kind == SubKeyKind::kNone ||
                           (h.subkey_kind == SubKeyKind::kPort && h.subkey == r.addr));
    const bool mmio_done = r.type == KvmEventType::kMmio && r.mmio_type == kKvmMmioRead &&
                           h.subkey_kind == SubKeyKind::kMmio && h.subkey == r.addr;
    if (pio_done || mmio_done) {
      if (pio_done) {
        h.subkey_kind = SubKeyKind::kPort;
        h.subkey = r.addr;
        h.size = static_cast<uint8_t>(r.size);
        h.dir = Direction::kRead;
      }
      h.value = r.data;
      ++stats_.completions;
      FlushHeld(t);
      return;
    }
    if (!KeepsHold(r.type)) FlushHeld(t);
  }

  const auto fill_ids = [&](ExitEvent& e) {
    e.tid = static_cast<uint32_t>(r.tid);
    e.vm = static_cast<uint32_t>(t.tgid >= 0 ? t.tgid : r.tid);
    e.vcpu = VcpuOf(r.tid, t);
  };

  switch (r.type) {
    case KvmEventType::kExit:
      if (t.phase == Phase::kKernelExit) ++stats_.unpaired_exits;
      if (t.phase == Phase::kUserExit) EndExit(t, r.ts);
      if (t.children) stats_.children_outside_exit += t.children;
      StartKernelExit(t, r);
      fill_ids(t.ev);
      break;
    case KvmEventType::kEntry:
      if (t.phase != Phase::kIdle) {
        EndExit(t, r.ts);
      } else {
        ++stats_.entries_without_exit;
        if (t.children) stats_.children_outside_exit += t.children;
        t.children = 0;
        t.child = Child{};
      }
      break;
    case KvmEventType::kUserspaceExit:
      if (t.phase == Phase::kKernelExit) {
        t.ev.userspace = true;
        std::string_view name =
            r.err < 0 ? (r.err == -4 ? "restart" : "error") : UserspaceExitName(r.reason);
        if (name.empty()) name = Intern(fmt::format("KVM_EXIT_{}", r.reason));
        t.ev.user_reason = name;
        break;
      }
      if (t.phase == Phase::kUserExit) ++stats_.unpaired_exits;
      StartUserExit(t, r);
      fill_ids(t.ev);
      break;
    case KvmEventType::kFpu:
      if (r.write == 1) {  // load: KVM_RUN entered, the guest is about to run
        if (t.phase == Phase::kUserExit) {
          EndExit(t, r.ts);
        } else if (t.phase == Phase::kIdle && t.children) {
          stats_.children_outside_exit += t.children;
          t.children = 0;
          t.child = Child{};
        }
      }
      break;
    default:
      if (IsChild(r.type)) AddChild(t, r);
      break;
  }
}

void KvmPairer::OnLost(uint32_t cpu, int64_t count) {
  ++stats_.lost_markers;
  if (count > 0) stats_.lost_events += static_cast<uint64_t>(count);
  for (auto& [tid, t] : threads_) {
    if (t.last_cpu != cpu) continue;
    FlushHeld(t);
    if (t.phase != Phase::kIdle) ++stats_.unpaired_exits;
    if (t.children) stats_.children_outside_exit += t.children;
    t.phase = Phase::kIdle;
    t.children = 0;
    t.child = Child{};
  }
}

void KvmPairer::Finish() {
  for (auto& [tid, t] : threads_) {
    FlushHeld(t);
    if (t.phase != Phase::kIdle) ++stats_.unpaired_exits;
    if (t.children) stats_.children_outside_exit += t.children;
    t.phase = Phase::kIdle;
    t.children = 0;
    t.child = Child{};
  }
}

}  // namespace exitscope::sources
