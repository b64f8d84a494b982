// analysis/diagnosis.cc: what took each vCPU's time, by cause (diagnosis.h).
#include "analysis/diagnosis.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "analysis/exit_table.h"
#include "base/text.h"

namespace exitscope::analysis {
namespace {

constexpr uint64_t kOpenIo = std::numeric_limits<uint64_t>::max();

std::string_view Basename(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// A frame of the C library, the loader, the unwinder or the C++ runtime: not the VMM's code.
bool SystemModule(std::string_view module) {
  const std::string_view b = Basename(module);
  for (std::string_view p : {"libc.so", "libc-", "libpthread", "ld-linux", "libunwind", "libstdc++",
                             "libgcc_s", "libm.so", "linux-vdso", "[vdso]"})
    if (b.substr(0, p.size()) == p) return true;
  return false;
}

// Scheduler and syscall-entry frames say nothing about why the thread slept.
bool PlumbingKernelFrame(std::string_view fn) {
  for (std::string_view p : {"__schedule", "schedule", "io_schedule", "preempt_schedule",
                             "do_syscall_64", "entry_SYSCALL", "__x64_sys_", "__do_sys_"})
    if (fn.substr(0, p.size()) == p) return true;
  return false;
}

std::string FrameText(const StackFrame& f) {
  if (f.function.empty()) return fmt::format("{:#x}", f.ip);
  if (f.file.empty()) return f.function;
  return fmt::format("{} ({}:{})", f.function, Basename(f.file), f.line);
}

}  // namespace

std::string DiagnosisCause(const ExitEvent& e) {
  if (e.subkey_kind != SubKeyKind::kPort && e.subkey_kind != SubKeyKind::kMmio)
    return std::string(e.reason);
  std::string s = TargetName(e);
  if (e.dir != AccessDir::kNone) {
    s += ' ';
    s += ToString(e.dir);
  }
  return s;
}

namespace {

DiagnosisEvidence Evidence(std::string kind, uint64_t exits, uint64_t ns = 0,
                           std::string device = {}) {
  DiagnosisEvidence e;
  e.kind = std::move(kind);
  e.exits = exits;
  e.ns = ns;
  e.device = std::move(device);
  return e;
}

bool IsIdle(const ExitEvent& e) {
  return e.reason == "HLT" || e.user_reason == "HLT";
}

void RankGroups(std::vector<DiagnosisGroup>& gs) {
  std::sort(gs.begin(), gs.end(), [](const DiagnosisGroup& a, const DiagnosisGroup& b) {
    if (a.lost_ns != b.lost_ns) return a.lost_ns > b.lost_ns;
    if (a.count != b.count) return a.count > b.count;
    return a.cause < b.cause;
  });
}

// Splits `all` into the ranked groups and the idle ones, and sets the shares.
void Rank(std::vector<DiagnosisGroup> all, Diagnosis& d) {
  const double vcpu_time = static_cast<double>(d.span_ns) * static_cast<double>(d.vcpus.size());
  for (DiagnosisGroup& g : all) {
    g.share = vcpu_time > 0 ? std::min(1.0, static_cast<double>(g.lost_ns) / vcpu_time) : 0.0;
    (g.idle ? d.idle : d.groups).push_back(std::move(g));
  }
  RankGroups(d.groups);
  RankGroups(d.idle);
  for (DiagnosisVcpu& v : d.vcpus)
    v.share = d.span_ns > 0
                  ? std::min(1.0, static_cast<double>(v.lost_ns) / static_cast<double>(d.span_ns))
                  : 0.0;
}

}  // namespace

DiagnosisEvidence StackEvidence(const ThreadStack& st) {
  DiagnosisEvidence ev;
  ev.kind = "stack";
  ev.state = st.state;
  size_t own = st.user.size();
  for (size_t i = 0; i < st.user.size(); ++i) {
    if (!SystemModule(st.user[i].module) && !st.user[i].function.empty()) {
      own = i;
      break;
    }
  }
  if (own < st.user.size()) {
    ev.frame = FrameText(st.user[own]);
    if (own > 0) ev.call = st.user[own - 1].function;
  } else if (!st.user.empty()) {
    ev.call = st.user.front().function;
  }
  for (const StackFrame& f : st.kernel) {
    if (PlumbingKernelFrame(f.function)) continue;
    ev.kernel = f.function;
    break;
  }
  if (ev.kernel.empty() && !st.kernel.empty()) ev.kernel = st.kernel.front().function;
  return ev;
}

DiagnosisBuilder::DiagnosisBuilder(DiagnosisOptions options) : options_(std::move(options)) {}

size_t DiagnosisBuilder::GroupOf(std::string_view cause, bool slow, bool open, bool in_kernel,
                                 bool idle) {
  const uint8_t bits = (slow ? 1 : 0) | (open ? 2 : 0) | (in_kernel ? 4 : 0);
  for (const TextMemo& m : text_memos_) {
    if (m.group != SIZE_MAX && m.bits == bits && base::SameShortText(m.cause, cause))
      return m.group;
  }
  const size_t gi = IndexGroup(cause, slow, open, in_kernel, idle);
  TextMemo& m = text_memos_[next_text_memo_];
  next_text_memo_ = (next_text_memo_ + 1) % kCauseMemos;
  m.cause = cause;
  m.bits = bits;
  m.group = gi;
  return gi;
}

size_t DiagnosisBuilder::IndexGroup(std::string_view cause, bool slow, bool open, bool in_kernel,
                                    bool idle) {
  scratch_ = cause;
  scratch_ += '\0';
  scratch_ += static_cast<char>('0' + (slow ? 1 : 0) + (open ? 2 : 0) + (in_kernel ? 4 : 0));
  auto [it, added] = group_index_.try_emplace(scratch_, groups_.size());
  if (added) {
    Group& g = groups_.emplace_back();
    g.out.cause = cause;
    g.out.slow = slow;
    g.out.open = open;
    g.out.in_kernel = in_kernel;
    g.out.idle = idle;
  }
  return it->second;
}

DiagnosisVcpu& DiagnosisBuilder::Vcpu(uint32_t vm, uint32_t vcpu) {
  if (last_vcpu_ != nullptr && last_vcpu_->vm == vm && last_vcpu_->vcpu == vcpu) {
    return *last_vcpu_;
  }
  DiagnosisVcpu& v = vcpus_[{vm, vcpu}];  // map nodes never move
  v.vm = vm;
  v.vcpu = vcpu;
  last_vcpu_ = &v;
  return v;
}

inline bool DiagnosisBuilder::CauseOf(const ExitEvent& e, std::string_view* cause) {
  if (options_.key) return options_.key(e, cause);
  cause_ = DiagnosisCause(e);
  *cause = cause_;
  return true;
}

void DiagnosisBuilder::OnExit(const ExitEvent& e) {
  if (e.kernel_access) return;  // an access handled in the kernel, not an exit (event.h)
  const bool open = e.end == ExitEnd::kOpenAtEnd;
  const bool idle = IsIdle(e);
  const bool slow = !idle && options_.slow.IsSlow(e);
  const bool in_kernel = e.side == Side::kKernel && !e.userspace;
  std::string_view cause;
  if (!CauseOf(e, &cause)) return;
  const size_t gi = GroupOf(cause, slow, open, in_kernel, idle);
  // A dump's open exit carries its time so far; a trace's carries none.
  const bool timed = e.end == ExitEnd::kSeen || (open && e.duration_ns != 0);
  const uint64_t d = timed ? e.duration_ns : 0;

  ++exits_;
  slow_ += slow ? 1 : 0;
  open_ += open ? 1 : 0;
  DiagnosisVcpu& v = Vcpu(e.side == Side::kKernel ? e.vm : 0, e.vcpu);
  ++v.exits;
  v.in_exits_ns += d;
  (idle ? v.idle_ns : v.lost_ns) += d;
  if (slow || open) v.slow_ns += d;
  first_ns_ = std::min(first_ns_, e.start_ns);
  last_ns_ = std::max(last_ns_, e.start_ns + d);

  Group& g = groups_[gi];
  if (g.out.count == 0 || e.start_ns < g.out.first_ns) g.out.first_ns = e.start_ns;
  g.out.last_ns = std::max(g.out.last_ns, e.start_ns);
  ++g.out.count;
  g.out.lost_ns += d;
  if (timed) g.hist.Add(d);
  if (g.last_vcpu != e.vcpu) {
    g.vcpus[e.vcpu] = true;
    g.last_vcpu = e.vcpu;
  }
  if ((slow || open) && (e.flags & kExitFlagStalled) != 0) ++g.stuck;  // HLT waits: no evidence
  if (e.side == Side::kKernel && e.userspace) ++g.userspace;
  if (slow || open) {
    if (kept_.size() < kMaxKeptExits)
      kept_.push_back({e.start_ns, e.start_ns + d, e.vcpu, gi, std::string(e.device)});
    else
      ++dropped_;
  }
}

void DiagnosisBuilder::OnDeviceEvent(const DeviceEvent& e) {
  switch (e.type) {
    case DeviceEventType::kIoSubmit: {
      auto it = io_open_.find(e.device);
      if (it == io_open_.end()) it = io_open_.try_emplace(std::string(e.device)).first;
      if (it->second.size() < kMaxIoSpans) it->second[e.io_id] = e.time_ns;
      break;
    }
    case DeviceEventType::kIoComplete: {
      auto it = io_open_.find(e.device);
      if (it == io_open_.end()) break;
      auto io = it->second.find(e.io_id);
      if (io == it->second.end()) break;
      if (io_kept_ < kMaxIoSpans) {
        auto sp = io_spans_.find(e.device);
        if (sp == io_spans_.end()) sp = io_spans_.try_emplace(std::string(e.device)).first;
        sp->second.push_back({io->second, std::max(io->second, e.time_ns)});
        ++io_kept_;
      } else {
        ++dropped_;
      }
      it->second.erase(io);
      break;
    }
    case DeviceEventType::kQueueFull: {
      auto it = queue_full_.find(e.device);
      if (it == queue_full_.end()) it = queue_full_.try_emplace(std::string(e.device)).first;
      if (it->second.size() < kMaxIoSpans) it->second.push_back(e.time_ns);
      break;
    }
    default:
      break;
  }
}

void DiagnosisBuilder::OnFinding(const Finding& f) {
  if (f.stack == nullptr || f.stack->empty()) return;
  if (stacks_.size() >= kMaxStacks) {
    ++dropped_;
    return;
  }
  stacks_.push_back({f.time_ns, f.vcpu, StackEvidence(*f.stack)});
}

void DiagnosisBuilder::OnSamples(const ExitEvent& e, const SampleBatch& b) {
  if (e.kernel_access) return;
  std::string_view cause;
  if (!CauseOf(e, &cause)) return;
  samples_ = true;
  const bool idle = IsIdle(e);
  const bool in_kernel = e.side == Side::kKernel && !e.userspace;
  Group& g = groups_[GroupOf(cause, false, false, in_kernel, idle)];
  const uint64_t n = b.timed + b.untimed;
  g.out.count += n;
  g.out.lost_ns += b.sum;
  g.hist.MergeBuckets(b.buckets, b.min, b.max);
  g.vcpus[e.vcpu] = true;
  exits_ += n;
  DiagnosisVcpu& v = Vcpu(e.vm, e.vcpu);
  v.exits += n;
  v.in_exits_ns += b.sum;
  (idle ? v.idle_ns : v.lost_ns) += b.sum;
}

Diagnosis DiagnosisBuilder::Finish(uint64_t span_ns) {
  Diagnosis d;
  d.exits = exits_;
  d.slow_exits = slow_;
  d.open_exits = open_;
  d.timed = !samples_;
  d.span_ns = samples_ ? span_ns : (last_ns_ > first_ns_ ? last_ns_ - first_ns_ : 0);
  d.evidence_dropped = dropped_;
  const uint64_t origin = samples_ || first_ns_ == UINT64_MAX ? 0 : first_ns_;
  for (const auto& [k, v] : vcpus_) d.vcpus.push_back(v);

  // The I/Os still open count as in flight until the end; spans by submit time.
  std::map<std::string, std::vector<IoSpan>, std::less<>> spans = io_spans_;
  std::map<std::string, uint64_t, std::less<>> longest;
  for (const auto& [dev, open] : io_open_)
    for (const auto& [id, t] : open) spans[dev].push_back({t, kOpenIo});
  for (auto& [dev, v] : spans) {
    std::sort(v.begin(), v.end(),
              [](const IoSpan& a, const IoSpan& b) { return a.submit_ns < b.submit_ns; });
    uint64_t m = 0;
    for (const IoSpan& s : v)
      m = std::max(m, s.complete_ns == kOpenIo ? kOpenIo : s.complete_ns - s.submit_ns);
    longest[dev] = m;
  }
  for (auto& [dev, v] : queue_full_) std::sort(v.begin(), v.end());
  std::vector<const StackSeen*> stacks;
  for (const StackSeen& s : stacks_) stacks.push_back(&s);
  std::sort(stacks.begin(), stacks.end(), [](const StackSeen* a, const StackSeen* b) {
    return std::tie(a->vcpu, a->time_ns) < std::tie(b->vcpu, b->time_ns);
  });

  struct Acc {
    uint64_t io = 0, queue_full = 0;
    std::string io_device, qf_device;
    std::vector<uint64_t> ages;
    std::map<std::string, std::pair<uint64_t, const DiagnosisEvidence*>> stacks;
  };
  std::vector<Acc> acc(groups_.size());
  for (const KeptSlow& x : kept_) {
    Acc& a = acc[x.group];
    if (auto sp = spans.find(x.device); !x.device.empty() && sp != spans.end()) {
      const std::vector<IoSpan>& v = sp->second;
      const uint64_t reach = longest[x.device];
      auto it = std::upper_bound(v.begin(), v.end(), x.end_ns,
                                 [](uint64_t t, const IoSpan& s) { return t < s.submit_ns; });
      uint64_t age = 0;
      bool any = false;
      while (it != v.begin()) {
        --it;
        if (reach != kOpenIo && it->submit_ns + reach < x.start_ns) break;
        if (it->complete_ns < x.start_ns) continue;
        any = true;
        age = std::max(age, std::min(x.end_ns, it->complete_ns) - it->submit_ns);
      }
      if (any) {
        ++a.io;
        a.io_device = x.device;
        a.ages.push_back(age);
      }
    }
    if (auto q = queue_full_.find(x.device); !x.device.empty() && q != queue_full_.end()) {
      auto it = std::lower_bound(q->second.begin(), q->second.end(), x.start_ns);
      if (it != q->second.end() && *it <= x.end_ns) {
        ++a.queue_full;
        a.qf_device = x.device;
      }
    }
    // The captures the watchdog made while the exit lasted (the first is enough to name it).
    auto it = std::lower_bound(
        stacks.begin(), stacks.end(), x, [](const StackSeen* s, const KeptSlow& k) {
          return std::tie(s->vcpu, s->time_ns) < std::tie(k.vcpu, k.start_ns);
        });
    if (it != stacks.end() && (*it)->vcpu == x.vcpu && (*it)->time_ns <= x.end_ns) {
      const DiagnosisEvidence& ev = (*it)->what;
      auto& slot = a.stacks[ev.call + '\0' + ev.frame + '\0' + ev.kernel];
      ++slot.first;
      slot.second = &ev;
    }
  }

  std::vector<DiagnosisGroup> all;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const Group& g = groups_[i];
    DiagnosisGroup o = g.out;
    o.first_ns = samples_ ? 0 : o.first_ns - origin;
    o.last_ns = samples_ ? 0 : o.last_ns - origin;
    o.typical_ns = g.hist.Quantile(0.5);
    o.p90_ns = g.hist.Quantile(0.9);
    o.worst_ns = g.hist.max();
    for (const auto& [vcpu, _] : g.vcpus) o.vcpus.push_back(vcpu);
    const Acc& a = acc[i];
    if (a.io != 0) {
      std::vector<uint64_t> ages = a.ages;
      std::nth_element(ages.begin(), ages.begin() + ages.size() / 2, ages.end());
      o.evidence.push_back(Evidence("io-in-flight", a.io, ages[ages.size() / 2], a.io_device));
    }
    if (!a.stacks.empty()) {
      auto best = std::max_element(
          a.stacks.begin(), a.stacks.end(),
          [](const auto& x, const auto& y) { return x.second.first < y.second.first; });
      DiagnosisEvidence ev = *best->second.second;
      ev.exits = best->second.first;
      o.evidence.push_back(std::move(ev));
    }
    if (a.queue_full != 0)
      o.evidence.push_back(Evidence("queue-full", a.queue_full, 0, a.qf_device));
    if (g.stuck != 0) o.evidence.push_back(Evidence("stuck", g.stuck));
    if (o.open) o.evidence.push_back(Evidence("open", o.count));
    if (o.in_kernel) o.evidence.push_back(Evidence("in-kernel", o.count));
    if ((o.slow || o.open) && g.userspace != 0)
      o.evidence.push_back(Evidence("in-vmm", g.userspace));
    all.push_back(std::move(o));
  }
  Rank(std::move(all), d);
  return d;
}

Diagnosis DiagnoseJoint(const JointView& view, uint64_t slow_ns) {
  Diagnosis d;
  struct Acc {
    DiagnosisGroup g;
    base::LatencyHistogram hist;
    std::map<uint32_t, bool> vcpus;
    uint64_t blocked = 0, preempted = 0, before = 0, after = 0, handler = 0;
    uint64_t n_blocked = 0, n_preempted = 0;
  };
  std::map<std::pair<std::string, bool>, Acc> groups;
  std::map<uint32_t, DiagnosisVcpu> vcpus;
  uint64_t first = UINT64_MAX, last = 0;
  for (const JointExit& x : view.matched) {
    std::string cause;
    if (!x.device.empty()) {
      cause = x.reg.empty() ? x.device : x.device + "." + x.reg;
    } else {
      cause = x.kind;
    }
    if (!x.dir.empty() && (!x.device.empty() || x.kind == "MMIO" || x.kind == "PIO"))
      cause += " " + x.dir;
    const bool idle = x.kind == "HLT";
    const bool slow = !idle && slow_ns != 0 && x.kernel_ns >= slow_ns;
    ++d.exits;
    d.slow_exits += slow ? 1 : 0;
    first = std::min(first, x.kernel_start_ns);
    last = std::max(last, x.kernel_start_ns + x.kernel_ns);
    DiagnosisVcpu& v = vcpus[x.vcpu];
    v.vcpu = x.vcpu;
    ++v.exits;
    v.in_exits_ns += x.kernel_ns;
    (idle ? v.idle_ns : v.lost_ns) += x.kernel_ns;
    if (slow) v.slow_ns += x.kernel_ns;
    if (!idle) v.off_cpu_ns += x.off_cpu_ns;

    Acc& a = groups[{cause, slow}];
    if (a.g.count == 0) {
      a.g.cause = cause;
      a.g.slow = slow;
      a.g.idle = idle;
      a.g.first_ns = x.kernel_start_ns;
    }
    a.g.first_ns = std::min(a.g.first_ns, x.kernel_start_ns);
    a.g.last_ns = std::max(a.g.last_ns, x.kernel_start_ns);
    ++a.g.count;
    a.g.lost_ns += x.kernel_ns;
    a.hist.Add(x.kernel_ns);
    a.vcpus[x.vcpu] = true;
    const uint64_t runnable = std::min(x.off_cpu_runnable_ns, x.off_cpu_ns);
    a.blocked += x.off_cpu_ns - runnable;
    a.preempted += runnable;
    a.n_blocked += x.off_cpu_ns > runnable ? 1 : 0;
    a.n_preempted += runnable > 0 ? 1 : 0;
    a.before += x.before_ns;
    a.after += x.after_ns;
    a.handler += x.handler_ns;
  }
  d.span_ns = last > first ? last - first : 0;
  const uint64_t origin = first == UINT64_MAX ? 0 : first;
  for (auto& [k, v] : vcpus) d.vcpus.push_back(v);
  std::vector<DiagnosisGroup> all;
  for (auto& [k, a] : groups) {
    DiagnosisGroup g = std::move(a.g);
    g.first_ns -= origin;
    g.last_ns -= origin;
    g.typical_ns = a.hist.Quantile(0.5);
    g.p90_ns = a.hist.Quantile(0.9);
    g.worst_ns = a.hist.max();
    for (const auto& [vcpu, _] : a.vcpus) g.vcpus.push_back(vcpu);
    if (view.sched_recorded) {
      g.evidence.push_back(Evidence("off-cpu", a.n_blocked, a.blocked));
      g.evidence.push_back(Evidence("preempted", a.n_preempted, a.preempted));
    }
    g.evidence.push_back(Evidence("handler", g.count, a.handler));
    g.evidence.push_back(Evidence("kernel-before", g.count, a.before));
    g.evidence.push_back(Evidence("kernel-after", g.count, a.after));
    std::stable_sort(
        g.evidence.begin(), g.evidence.end(),
        [](const DiagnosisEvidence& x, const DiagnosisEvidence& y) { return x.ns > y.ns; });
    std::erase_if(g.evidence, [](const DiagnosisEvidence& e) { return e.ns == 0; });
    all.push_back(std::move(g));
  }
  Rank(std::move(all), d);
  return d;
}

}  // namespace exitscope::analysis
