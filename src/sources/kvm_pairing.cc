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

bool IsAccess(KvmEventType t) noexcept {
  return t == KvmEventType::kPio || t == KvmEventType::kMmio || t == KvmEventType::kMsr ||
         t == KvmEventType::kHypercall;
}

// Records that may sit between re-entry and a read's completion without ending the wait.
// The kernel completes a read before it emulates the next instruction, so a PIO read
// waits only across these; an MMIO read (matched by its gpa) also across kvm_emulate_insn.
bool KeepsHold(KvmEventType t) noexcept {
  return t == KvmEventType::kFpu || t == KvmEventType::kVcpuMatchMmio || t == KvmEventType::kEntry;
}

// IN / INS -> kRead, OUT / OUTS -> kWrite, anything else (or no bytes) -> kNone.
AccessDir PortInsnDirection(const KvmRecord& r) noexcept {
  for (size_t i = 0; i < r.insn_len && i < r.insn.size(); ++i) {
    const uint8_t b = r.insn[i];
    const bool prefix = b == 0x66 || b == 0x67 || b == 0xf2 || b == 0xf3 || b == 0xf0 ||
                        b == 0x2e || b == 0x36 || b == 0x3e || b == 0x26 || b == 0x64 ||
                        b == 0x65 || (b >= 0x40 && b <= 0x4f);
    if (prefix) continue;
    switch (b) {
      case 0xe4:
      case 0xe5:
      case 0xec:
      case 0xed:
      case 0x6c:
      case 0x6d:
        return AccessDir::kRead;
      case 0xe6:
      case 0xe7:
      case 0xee:
      case 0xef:
      case 0x6e:
      case 0x6f:
        return AccessDir::kWrite;
      default:
        return AccessDir::kNone;
    }
  }
  return AccessDir::kNone;
}

std::string_view AccessReason(SubKeyKind k) noexcept {
  switch (k) {
    case SubKeyKind::kPort:
      return "PIO";
    case SubKeyKind::kMmio:
      return "MMIO";
    case SubKeyKind::kMsr:
      return "MSR";
    case SubKeyKind::kHypercall:
      return "HYPERCALL";
    case SubKeyKind::kNone:
      break;
  }
  return "ACCESS";
}

}  // namespace

KvmPairer::KvmPairer(KvmPairerOptions options, EventSink* sink) : options_(options), sink_(sink) {}

KvmPairer KvmPairer::Fresh(const Numbering& numbering) const {
  KvmPairer p(options_, nullptr);
  p.tgid_of_ = tgid_of_;
  p.next_vcpu_ = numbering.next_vcpu;
  p.vcpu_of_tid_ = numbering.vcpu_of_tid;
  return p;
}

bool KvmPairer::SameThread(const Thread& a, const Thread& b) const {
  if (a.phase != b.phase || a.last_cpu != b.last_cpu || a.tid != b.tid || a.tgid != b.tgid ||
      a.vcpu != b.vcpu || a.vcpu_index != b.vcpu_index || a.seen_entry != b.seen_entry ||
      a.children != b.children || !(a.child == b.child) || a.window != b.window ||
      a.window_fresh != b.window_fresh || a.last_rip != b.last_rip || a.insn_dir != b.insn_dir ||
      a.hold_next != b.hold_next || a.held != b.held) {
    return false;
  }
  // The exit being built, the held exit and the pio_write candidate are read only while
  // their phase or hold lasts; each is set anew when one starts.
  if (a.phase != Phase::kIdle &&
      (a.exit_ts != b.exit_ts || a.ev_is_kernel != b.ev_is_kernel || !(a.ev == b.ev))) {
    return false;
  }
  if (a.held != Hold::kNone && !(a.held_ev == b.held_ev)) return false;
  const bool maybe = a.hold_next == Hold::kPioMaybe || a.held == Hold::kPioMaybe;
  return !maybe || a.candidate == b.candidate;
}

void KvmPairer::Spec::OnExit(const ExitEvent& e) {
  // Only what the pairer sets: the rest must be the defaults Unkept gives back.
  if (kept.items.size() >= kMaxItems || e.device_offset != ExitEvent::kNoOffset ||
      e.kind != ExitKind::kUnknown || e.flags != 0 || e.side != Side::kKernel) {
    failed = true;
    return;
  }
  // Strings by their place in memory (the pairer's interned texts, or static names): a memo
  // by address first, then the table.
  const auto str = [this](std::string_view v) -> uint16_t {
    Memo& m = memo[(reinterpret_cast<uintptr_t>(v.data()) >> 3) % memo.size()];
    if (m.text.data() == v.data() && m.text.size() == v.size() && m.index != kNoIndex) {
      return m.index;
    }
    std::vector<std::string_view>& t = kept.strings;
    size_t i = t.size();
    while (i-- > 0 && !(t[i].data() == v.data() && t[i].size() == v.size())) {
    }
    if (i == SIZE_MAX) {
      if (t.size() > UINT16_MAX) {
        failed = true;
        return 0;
      }
      t.push_back(v);
      i = t.size() - 1;
    }
    m.text = v;
    m.index = static_cast<uint16_t>(i);
    return m.index;
  };
  KeptItem& k = kept.items.emplace_back();
  k.start_ns = e.start_ns;
  k.duration_ns = e.duration_ns;
  k.subkey = e.subkey;
  k.value = e.value;
  k.guest_rip = e.guest_rip;
  k.vcpu = e.vcpu;
  k.vm = e.vm;
  k.tid = e.tid;
  k.reason = str(e.reason);
  k.user_reason = str(e.user_reason);
  k.device = str(e.device);
  k.reg = str(e.reg);
  k.size = e.size;
  k.dir = static_cast<uint8_t>(e.dir);
  k.isa = static_cast<uint8_t>(e.isa);
  k.subkey_kind = static_cast<uint8_t>(e.subkey_kind);
  k.end = static_cast<uint8_t>(e.end);
  k.bits = static_cast<uint8_t>((e.userspace ? 1 : 0) | (e.failed_vmentry ? 2 : 0) |
                                (e.kernel_access ? 4 : 0));
  k.what = kKeptExit;
}

ExitEvent KvmPairer::Unkept(const KeptItem& k, const SpecBuffer& b) {
  ExitEvent e;
  e.start_ns = k.start_ns;
  e.duration_ns = k.duration_ns;
  e.subkey = k.subkey;
  e.value = k.value;
  e.guest_rip = k.guest_rip;
  e.vcpu = k.vcpu;
  e.vm = k.vm;
  e.tid = k.tid;
  e.reason = b.strings[k.reason];
  e.user_reason = b.strings[k.user_reason];
  e.device = b.strings[k.device];
  e.reg = b.strings[k.reg];
  e.size = k.size;
  e.dir = static_cast<AccessDir>(k.dir);
  e.isa = static_cast<Isa>(k.isa);
  e.subkey_kind = static_cast<SubKeyKind>(k.subkey_kind);
  e.end = static_cast<ExitEnd>(k.end);
  e.userspace = (k.bits & 1) != 0;
  e.failed_vmentry = (k.bits & 2) != 0;
  e.kernel_access = (k.bits & 4) != 0;
  return e;
}

void KvmPairer::Arm(SpecBuffer buffer) {
  spec_ = std::make_unique<Spec>();
  spec_->kept = std::move(buffer);
  // One huge page (a segment's exits fit many times over).
  if (spec_->kept.items.capacity() == 0) {
    spec_->kept.items.reserve(base::kHugePage / sizeof(KeptItem));
  }
  spec_->kept.items.clear();
  spec_->kept.records.clear();
  spec_->kept.switches.clear();
  spec_->kept.strings.clear();
  spec_->at_arm = stats_;
  sink_ = spec_.get();
  for (auto& [tid, t] : threads_) {
    // Numbered by the seed (or by its records' vcpu_id): its state is checked here; numbered
    // here, its exits could not be numbered as the other pairer numbers them.
    const bool seeded = !t.spec_tainted && (t.vcpu >= 0 || vcpu_of_tid_.contains(tid));
    t.spec = seeded ? 0 : 2;
    if (seeded) {
      spec_->Keep(kKeptSwitch, spec_->kept.switches.size());
      spec_->kept.switches.emplace_back(tid, t);
    }
  }
}

KvmPairer::SpecBuffer KvmPairer::Disarm() {
  if (!spec_) return {};
  SpecBuffer b = std::move(spec_->kept);
  spec_.reset();
  sink_ = nullptr;
  return b;
}

namespace {
// to += now - then, counter by counter.
void AddSince(KvmPairingStats* to, const KvmPairingStats& now, const KvmPairingStats& then) {
  static_assert(sizeof(KvmPairingStats) == sizeof(uint64_t) * (kKvmEventTypeCount + 14),
                "a counter was added to KvmPairingStats: add it here");
  for (size_t i = 0; i < kKvmEventTypeCount; ++i)
    to->records[i] += now.records[i] - then.records[i];
  for (auto f : {&KvmPairingStats::records_total, &KvmPairingStats::exits,
                 &KvmPairingStats::kernel_exits, &KvmPairingStats::userspace_exits,
                 &KvmPairingStats::open_at_end, &KvmPairingStats::exits_time_unknown,
                 &KvmPairingStats::kernel_accesses, &KvmPairingStats::lost_events,
                 &KvmPairingStats::lost_markers, &KvmPairingStats::unpaired_exits,
                 &KvmPairingStats::entries_without_exit, &KvmPairingStats::children_outside_exit,
                 &KvmPairingStats::completions, &KvmPairingStats::failed_vmentry}) {
    to->*f += now.*f - then.*f;
  }
}
}  // namespace

bool KvmPairer::CanTake(const KvmPairer& later) const {
  if (!later.spec_ || later.spec_->failed) return false;
  // The threads the items concern, copied, with this pairer's numbering: the records left to
  // this pairer are paired on them as Take would, and each state `later` starts to vouch for
  // is checked where it starts to.
  KvmPairer scratch(options_, nullptr);
  scratch.tgid_of_ = tgid_of_;
  scratch.next_vcpu_ = next_vcpu_;
  scratch.vcpu_of_tid_ = vcpu_of_tid_;
  const auto copy = [&](int32_t tid) {
    if (scratch.threads_.contains(tid)) return;
    if (auto it = threads_.find(tid); it != threads_.end())
      scratch.threads_.emplace(tid, it->second);
  };
  const SpecBuffer& kept = later.spec_->kept;
  for (const KeptItem& item : kept.items) {
    if (item.what == kKeptSwitch) {
      const auto& [tid, state] = kept.switches[item.subkey];
      copy(tid);
      const auto it = scratch.threads_.find(tid);
      if (it == scratch.threads_.end() || !SameThread(it->second, state)) return false;
    } else if (item.what == kKeptRecord) {
      const KvmRecord& r = kept.records[item.subkey];
      copy(r.tid);
      scratch.Feed(r);
    }
  }
  return true;
}

KvmPairer::SpecBuffer KvmPairer::Take(KvmPairer&& later) {
  Spec& spec = *later.spec_;
  for (const KeptItem& item : spec.kept.items) {
    if (item.what == kKeptExit) {
      if (sink_ != nullptr) sink_->OnExit(Unkept(item, spec.kept));
    } else if (item.what == kKeptRecord) {
      Feed(spec.kept.records[item.subkey]);
    }
  }
  // The threads `later` paired: their states now (each is one of this pairer's already, by
  // the records before the segment or the shadow's first ones).
  for (auto& [tid, t] : later.threads_) {
    if (t.spec != 0) continue;
    auto it = threads_.find(tid);
    if (it == threads_.end()) continue;  // CanTake checked every one
    it->second = std::move(t);
    it->second.spec = 0;
  }
  cpu_last_ = {};
  AddSince(&stats_, later.stats_, spec.at_arm);
  for (auto& [text, view] : later.interned_index_) interned_index_.try_emplace(text, view);
  taken_over_.push_back(std::move(later.interned_));  // a moved deque keeps its elements' place
  for (auto& d : later.taken_over_) taken_over_.push_back(std::move(d));
  return std::move(spec.kept);  // Arm empties it
}

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

KvmPairer::Thread& KvmPairer::ThreadOfSlow(const KvmRecord& r, CpuLast* last) {
  auto [it, inserted] = threads_.try_emplace(r.tid);
  Thread& t = it->second;
  last->thread = &t;  // unordered_map nodes never move
  last->tid = r.tid;
  if (inserted) {
    t.tid = r.tid;
    if (auto g = tgid_of_.find(r.tid); g != tgid_of_.end()) t.tgid = g->second;
    if (spec_ != nullptr) t.spec = 1;  // armed: a thread first met now starts in the shadow
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
  t.spec_tainted = true;  // a speculative pairer's number is not the other pairer's
  return v;
}

void KvmPairer::FillIds(Thread& t, ExitEvent* e) {
  e->tid = static_cast<uint32_t>(t.tid);
  e->vm = static_cast<uint32_t>(t.tgid >= 0 ? t.tgid : t.tid);
  e->vcpu = VcpuOf(t.tid, t);
}

void KvmPairer::AddAccess(Thread& t, const KvmRecord& r) {
  Access a;
  a.ts = r.ts;
  a.rip = t.last_rip;
  a.key = r.addr;
  a.value = r.data;
  switch (r.type) {
    case KvmEventType::kPio:
      a.kind = SubKeyKind::kPort;
      a.size = static_cast<uint8_t>(r.size);
      a.dir = r.write ? AccessDir::kWrite : AccessDir::kRead;
      break;
    case KvmEventType::kMmio:
      a.kind = SubKeyKind::kMmio;
      a.size = static_cast<uint8_t>(r.size);
      a.dir = r.mmio_type == kKvmMmioWrite ? AccessDir::kWrite : AccessDir::kRead;
      a.unsatisfied = r.mmio_type == kKvmMmioUnsatisfiedRead;
      break;
    case KvmEventType::kMsr:
      a.kind = SubKeyKind::kMsr;
      a.size = 8;
      a.dir = r.write ? AccessDir::kWrite : AccessDir::kRead;
      break;
    case KvmEventType::kHypercall:
      a.kind = SubKeyKind::kHypercall;
      a.value = 0;
      break;
    default:
      return;
  }
  t.window.push_back(a);
  t.window_fresh = false;
}

void KvmPairer::EmitAccess(Thread& t, const Access& a) {
  ExitEvent e;
  FillIds(t, &e);
  e.start_ns = options_.clock.ToNs(a.ts);
  e.reason = AccessReason(a.kind);
  e.subkey_kind = a.kind;
  e.subkey = a.key;
  e.size = a.size;
  e.dir = a.dir;
  e.value = a.value;
  e.guest_rip = a.rip;
  e.end = ExitEnd::kNotTraced;
  e.kernel_access = true;
  Resolve(&e);
  ++stats_.exits;
  ++stats_.kernel_accesses;
  if (sink_ != nullptr) sink_->OnExit(e);
}

void KvmPairer::EmitWindowAsKernel(Thread& t) {
  for (const Access& a : t.window) EmitAccess(t, a);
  t.window.clear();
}

void KvmPairer::ClearWindow(Thread& t, bool count_outside) {
  if (count_outside) stats_.children_outside_exit += t.window.size() + t.children;
  t.window.clear();
  t.children = 0;
  t.child = Child{};
}

void KvmPairer::AddChild(Thread& t, const KvmRecord& r) {
  Child& c = t.child;
  switch (r.type) {
    case KvmEventType::kPio:
      if (r.write == 0 && c.kind == SubKeyKind::kPort && c.key == r.addr &&
          c.dir == AccessDir::kRead) {
        c.value = r.data;  // completion of an IN handled before kvm_entry
        break;
      }
      c.kind = SubKeyKind::kPort;
      c.key = r.addr;
      c.size = static_cast<uint8_t>(r.size);
      c.dir = r.write ? AccessDir::kWrite : AccessDir::kRead;
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
      c.dir = r.mmio_type == kKvmMmioWrite ? AccessDir::kWrite : AccessDir::kRead;
      c.value = r.data;
      break;
    case KvmEventType::kVcpuMatchMmio:
      if (c.kind == SubKeyKind::kNone) {
        c.kind = SubKeyKind::kMmio;
        c.key = r.addr;
        c.dir = r.write ? AccessDir::kWrite : AccessDir::kRead;
      }
      break;
    case KvmEventType::kMsr:
      c.kind = SubKeyKind::kMsr;
      c.key = r.addr;
      c.size = 8;
      c.dir = r.write ? AccessDir::kWrite : AccessDir::kRead;
      c.value = r.data;
      break;
    case KvmEventType::kHypercall:
      c.kind = SubKeyKind::kHypercall;
      c.key = r.addr;
      c.dir = AccessDir::kNone;
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
  const auto kind = static_cast<uint8_t>(e->subkey_kind);
  const auto dir = static_cast<uint8_t>(e->dir);
  DeviceMemo& m = device_memo_[(e->subkey ^ (e->subkey >> 12) ^ e->size) % device_memo_.size()];
  if (!(m.used && m.addr == e->subkey && m.size == e->size && m.kind == kind && m.dir == dir)) {
    m.addr = e->subkey;
    m.size = e->size;
    m.kind = kind;
    m.dir = dir;
    m.used = true;
    m.found =
        options_.devices->Resolve(e->subkey_kind, e->subkey, e->size, e->dir, &m.device, &m.reg);
  }
  e->device = m.found ? m.device : std::string_view{};
  e->reg = m.found ? m.reg : std::string_view{};
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
  } else if (!r.reason_name.empty()) {
    e.reason = Intern(std::string(r.reason_name));  // as the trace printed it
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
      e.dir = (r.info1 & 8) ? AccessDir::kRead : AccessDir::kWrite;
    } else if (e.isa == Isa::kSvm) {
      e.subkey_kind = SubKeyKind::kPort;
      e.subkey = (r.info1 >> 16) & 0xffff;
      e.size = (r.info1 & 0x10) ? 1 : (r.info1 & 0x20) ? 2 : (r.info1 & 0x40) ? 4 : 0;
      e.dir = (r.info1 & 1) ? AccessDir::kRead : AccessDir::kWrite;
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
  e.guest_rip = t.last_rip;

  // Which access of the window is the exit's own (see the header); the rest were handled in
  // the kernel.
  const auto last_of = [&](auto pred) -> int {
    for (size_t i = t.window.size(); i-- > 0;) {
      if (pred(t.window[i])) return static_cast<int>(i);
    }
    return -1;
  };
  int own = -1;
  t.hold_next = Hold::kNone;
  // KVM_EXIT_* of the exit (the numbers of UserspaceExitName's table), none for an error.
  constexpr uint32_t kExitIo = 2, kExitHypercall = 3, kExitMmio = 6;
  const uint32_t code = r.err < 0 ? UINT32_MAX : r.reason;
  if (code == kExitIo) {
    if (t.insn_dir == AccessDir::kRead) {
      t.hold_next = Hold::kPioRead;
    } else {
      own = last_of([](const Access& a) {
        return a.kind == SubKeyKind::kPort && a.dir == AccessDir::kWrite;
      });
      if (own < 0) {
        t.hold_next = Hold::kPioRead;
      } else if (t.insn_dir == AccessDir::kNone) {
        t.hold_next = Hold::kPioMaybe;
        t.candidate = t.window[static_cast<size_t>(own)];
      }
    }
  } else if (code == kExitMmio) {
    own = last_of([](const Access& a) {
      return a.kind == SubKeyKind::kMmio && (a.dir == AccessDir::kWrite || a.unsatisfied);
    });
    if (own >= 0 && t.window[static_cast<size_t>(own)].unsatisfied) t.hold_next = Hold::kMmioRead;
  } else if (code == kExitHypercall) {
    own = last_of([](const Access& a) { return a.kind == SubKeyKind::kHypercall; });
  }
  for (size_t i = 0; i < t.window.size(); ++i) {
    if (static_cast<int>(i) != own) EmitAccess(t, t.window[i]);
  }
  if (own >= 0) {
    const Access& a = t.window[static_cast<size_t>(own)];
    e.subkey_kind = a.kind;
    e.subkey = a.key;
    e.size = a.size;
    e.dir = a.dir;
    e.value = a.unsatisfied ? 0 : a.value;
    if (a.rip != 0) e.guest_rip = a.rip;
  } else if (t.hold_next == Hold::kPioRead) {
    e.dir = AccessDir::kRead;
  }
  t.window.clear();
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
  if (t.spec_ends < 255) ++t.spec_ends;
  if (!t.ev_is_kernel && t.hold_next != Hold::kNone) {
    t.held = t.hold_next;
    t.held_ev = e;
    t.hold_next = Hold::kNone;
    return;
  }
  Emit(e, t.ev_is_kernel);
}

// An exit open when the input ends (or whose end the thread never traces).
void KvmPairer::EndOpen(Thread& t) {
  if (t.phase == Phase::kIdle) return;
  ExitEvent& e = t.ev;
  if (t.ev_is_kernel) ApplyChild(t, &e);
  if (!t.ev_is_kernel && t.hold_next == Hold::kPioMaybe) {
    // Best guess: the write was the exit's (no completion can tell otherwise now).
    t.hold_next = Hold::kNone;
  }
  e.start_ns = options_.clock.ToNs(t.exit_ts);
  e.duration_ns = 0;
  if (t.ev_is_kernel && !t.seen_entry) {
    e.end = ExitEnd::kNotTraced;
  } else {
    e.end = ExitEnd::kOpenAtEnd;
    ++stats_.unpaired_exits;
  }
  t.phase = Phase::kIdle;
  t.hold_next = Hold::kNone;
  t.children = 0;
  t.child = Child{};
  Emit(e, t.ev_is_kernel);
}

bool KvmPairer::ResolveHeld(Thread& t, const KvmRecord& r) {
  ExitEvent& h = t.held_ev;
  const Hold kind = t.held;
  if (kind == Hold::kPioRead || kind == Hold::kPioMaybe) {
    if (r.type == KvmEventType::kPio && r.write == 0 && t.window_fresh) {
      if (kind == Hold::kPioMaybe) EmitAccess(t, t.candidate);  // handled in the kernel
      h.subkey_kind = SubKeyKind::kPort;
      h.subkey = r.addr;
      h.size = static_cast<uint8_t>(r.size);
      h.dir = AccessDir::kRead;
      h.value = r.data;
      ++stats_.completions;
      t.held = Hold::kNone;
      Emit(h, false);
      return true;
    }
    if (KeepsHold(r.type)) return false;
  } else if (kind == Hold::kMmioRead) {
    if (r.type == KvmEventType::kMmio && r.mmio_type == kKvmMmioRead && r.addr == h.subkey) {
      h.value = r.data;
      ++stats_.completions;
      t.held = Hold::kNone;
      Emit(h, false);
      return true;
    }
    if (KeepsHold(r.type) || r.type == KvmEventType::kEmulateInsn) return false;
  }
  FlushHeld(t);
  return false;
}

void KvmPairer::FlushHeld(Thread& t) {
  if (t.held == Hold::kNone) return;
  ExitEvent& h = t.held_ev;
  if (t.held == Hold::kPioMaybe) {  // no completion came: the write was the exit's
    h.subkey_kind = t.candidate.kind;
    h.subkey = t.candidate.key;
    h.size = t.candidate.size;
    h.dir = t.candidate.dir;
    h.value = t.candidate.value;
  }
  t.held = Hold::kNone;
  Emit(h, false);
}

void KvmPairer::Emit(ExitEvent& e, bool kernel) {
  Resolve(&e);
  ++stats_.exits;
  if (e.end == ExitEnd::kOpenAtEnd) {
    ++stats_.open_at_end;
  } else if (e.end == ExitEnd::kNotTraced) {
    ++stats_.exits_time_unknown;
  } else {
    if (kernel) ++stats_.kernel_exits;
    if (e.userspace) ++stats_.userspace_exits;
  }
  if (e.failed_vmentry) ++stats_.failed_vmentry;
  if (sink_ != nullptr) sink_->OnExit(e);
}

void KvmPairer::SpecFeed(Thread& t, const KvmRecord& r) {
  if (spec_->kept.items.size() >= Spec::kMaxItems) {
    spec_->failed = true;
    return;
  }
  spec_->Keep(kKeptRecord, spec_->kept.records.size());  // the other pairer's, counted there
  spec_->kept.records.push_back(r);
  if (t.spec == 2) return;
  // In the shadow: paired here, nothing counted or kept, until two exits have ended.
  const KvmPairingStats counted = stats_;
  EventSink* const sink = sink_;
  sink_ = nullptr;
  FeedThread(t, r);
  sink_ = sink;
  stats_ = counted;
  if (t.spec_tainted) {
    t.spec = 2;
  } else if (t.spec_ends >= 2) {
    t.spec = 0;
    spec_->Keep(kKeptSwitch, spec_->kept.switches.size());
    spec_->kept.switches.emplace_back(r.tid, t);
  }
}

void KvmPairer::Feed(const KvmRecord& r) {
  if (observer_ != nullptr) observer_(r, observer_ctx_);
  // sched_switch is no part of an exit: counted, seen by the observer (the joint view takes
  // off-CPU time from it), never paired.
  const bool threadless = r.type == KvmEventType::kOther || r.type == KvmEventType::kCount ||
                          r.type == KvmEventType::kSchedSwitch;
  if (spec_ != nullptr && !threadless) {  // armed (speculative pairing)
    Thread& t = ThreadOf(r);
    if (t.spec != 0) {
      SpecFeed(t, r);
      return;
    }
  }
  ++stats_.records_total;
  ++stats_.records[static_cast<size_t>(r.type) < kKvmEventTypeCount ? static_cast<size_t>(r.type)
                                                                    : 0];
  if (threadless) return;
  FeedThread(ThreadOf(r), r);
}

void KvmPairer::FeedThread(Thread& t, const KvmRecord& r) {
  if (r.vcpu_id >= 0 && (r.type == KvmEventType::kExit || r.type == KvmEventType::kEntry ||
                         r.type == KvmEventType::kPageFault)) {
    t.vcpu = r.vcpu_id;
  }

  if (t.held != Hold::kNone && ResolveHeld(t, r)) {
    t.window_fresh = false;
    return;
  }

  switch (r.type) {
    case KvmEventType::kExit:
      if (t.phase == Phase::kKernelExit) {
        if (t.seen_entry) {
          ++stats_.unpaired_exits;
        } else {
          EndOpen(t);  // no kvm_entry on this thread: counted without time
        }
      }
      if (t.phase == Phase::kUserExit) EndExit(t, r.ts);
      ClearWindow(t, true);
      StartKernelExit(t, r);
      FillIds(t, &t.ev);
      break;
    case KvmEventType::kEntry:
      t.seen_entry = true;
      if (t.phase != Phase::kIdle) {
        EndExit(t, r.ts);
      } else {
        ++stats_.entries_without_exit;
        ClearWindow(t, true);
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
      FillIds(t, &t.ev);
      break;
    case KvmEventType::kFpu:
      if (r.write == 1) {  // load: KVM_RUN entered, the guest is about to run
        if (t.phase == Phase::kUserExit) {
          EndExit(t, r.ts);
        } else if (t.phase == Phase::kIdle) {
          // A window that ended without an exit: its accesses were handled in the kernel.
          EmitWindowAsKernel(t);
          if (t.children) stats_.children_outside_exit += t.children;
          t.children = 0;
          t.child = Child{};
        }
        if (t.phase == Phase::kIdle) {
          t.window_fresh = true;
          t.last_rip = 0;
          t.insn_dir = AccessDir::kNone;
        }
      }
      break;
    default:
      if (t.phase == Phase::kKernelExit) {
        if (IsChild(r.type)) AddChild(t, r);
        break;
      }
      if (IsAccess(r.type)) {
        AddAccess(t, r);
      } else if (IsChild(r.type)) {
        if (r.type == KvmEventType::kEmulateInsn) {
          t.last_rip = r.guest_rip;
          t.insn_dir = PortInsnDirection(r);
          t.window_fresh = false;
        } else if (r.type == KvmEventType::kPageFault && r.vcpu_id >= 0) {
          t.vcpu = r.vcpu_id;
        }
        ++t.children;
      }
      break;
  }
}

void KvmPairer::OnLost(uint32_t cpu, int64_t count) {
  // Armed: a loss ends the state of threads this pairer does not pair; not taken.
  if (spec_ != nullptr) spec_->failed = true;
  ++stats_.lost_markers;
  if (count > 0) stats_.lost_events += static_cast<uint64_t>(count);
  for (auto& [tid, t] : threads_) {
    if (t.last_cpu != cpu) continue;
    FlushHeld(t);
    if (t.phase != Phase::kIdle) ++stats_.unpaired_exits;
    ClearWindow(t, true);
    t.phase = Phase::kIdle;
    t.hold_next = Hold::kNone;
    t.window_fresh = true;
  }
}

void KvmPairer::Finish() {
  for (auto& [tid, t] : threads_) {
    FlushHeld(t);
    EndOpen(t);
    ClearWindow(t, true);
    t.window_fresh = true;
  }
}

}  // namespace exitscope::sources
