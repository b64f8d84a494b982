#include "analysis/joint_view.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "base/histogram.h"
#include "exitscope/clock.h"
#include "sources/dump_source.h"
#include "sources/kvm_device_map.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"
#include "sources/source.h"

namespace exitscope::analysis {
namespace {

constexpr uint64_t kOpen = std::numeric_limits<uint64_t>::max();

// A kernel userspace exit in CLOCK_MONOTONIC ns of the dump's clock.
struct KernelExit {
  uint64_t start = 0;
  uint64_t end = kOpen;  // kOpen: open at end of trace
  const ExitEvent* e = nullptr;
  bool used = false;     // matched
  bool claimed = false;  // open: a VMM exit inside it already explained by it
};

// Per thread, kernel exits sorted by start (they never overlap on one thread).
using Threads = std::map<uint32_t, std::vector<KernelExit>>;

// The one kernel exit of `exits` that may contain [start, end]: the last one starting at or
// before start (+ tolerance). nullptr when it does not contain it.
KernelExit* Containing(std::vector<KernelExit>& exits, uint64_t start, uint64_t end, uint64_t tol) {
  auto it = std::upper_bound(exits.begin(), exits.end(), start + tol,
                             [](uint64_t t, const KernelExit& k) { return t < k.start; });
  if (it == exits.begin()) return nullptr;
  --it;
  if (it->end != kOpen && end > it->end + tol) return nullptr;
  return &*it;
}

std::string DirName(AccessDir d) {
  return d == AccessDir::kNone ? std::string() : std::string(ToString(d));
}

std::string DescribeVmm(const ExitEvent& d) {
  std::string s(ToString(d.kind));
  if (!d.device.empty()) {
    s += " " + std::string(d.device) + (d.reg.empty() ? "" : "." + std::string(d.reg));
  }
  if (d.dir != AccessDir::kNone) s += " " + DirName(d.dir);
  return s;
}

std::string DescribeKernel(const ExitEvent& e) {
  std::string s(e.user_reason.empty() ? e.reason : e.user_reason);
  if (!e.device.empty())
    s += " " + std::string(e.device) + (e.reg.empty() ? "" : ".") + std::string(e.reg);
  if (e.subkey_kind != SubKeyKind::kNone) s += fmt::format(" {:#x}", e.subkey);
  return s;
}

// When each thread was switched out, in the dump's ns: sorted, disjoint intervals.
struct OffCpu {
  uint64_t start = 0, end = kOpen;
  bool runnable = false;
};
using OffCpuByThread = std::unordered_map<uint32_t, std::vector<OffCpu>>;

OffCpuByThread BuildOffCpu(const std::vector<SchedSwitch>& sched, const Clock& clock) {
  OffCpuByThread off;
  std::unordered_map<uint32_t, bool> seen;  // tid -> a switch of it came before
  for (const SchedSwitch& s : sched) {
    const uint64_t t = clock.ToMonotonicNs(s.ts);
    if (s.prev_tid != 0) {  // pid 0: the idle task, never a vCPU
      std::vector<OffCpu>& v = off[s.prev_tid];
      if (v.empty() || v.back().end != kOpen) v.push_back({t, kOpen, s.prev_runnable});
      seen[s.prev_tid] = true;
    }
    if (s.next_tid != 0) {
      std::vector<OffCpu>& v = off[s.next_tid];
      if (!v.empty() && v.back().end == kOpen) {
        v.back().end = std::max(t, v.back().start);
      } else if (!seen[s.next_tid]) {
        v.push_back({0, t, false});  // first seen switching in: off since the trace began
      }
      seen[s.next_tid] = true;
    }
  }
  return off;
}

struct OffSplit {
  uint64_t total = 0, runnable = 0;
};
// Time of [a, b) the thread spent switched out.
OffSplit OffCpuIn(const std::vector<OffCpu>* v, uint64_t a, uint64_t b) {
  OffSplit r;
  if (v == nullptr || b <= a) return r;
  auto it = std::lower_bound(v->begin(), v->end(), a,
                             [](const OffCpu& o, uint64_t t) { return o.end <= t; });
  for (; it != v->end() && it->start < b; ++it) {
    const uint64_t lo = std::max(a, it->start), hi = std::min(b, it->end);
    if (hi <= lo) continue;
    r.total += hi - lo;
    if (it->runnable) r.runnable += hi - lo;
  }
  return r;
}

// The switched-out intervals of [a, b), clipped to it.
std::vector<JointExit::OffCpuSpan> OffCpuSpans(const std::vector<OffCpu>& v, uint64_t a,
                                               uint64_t b) {
  std::vector<JointExit::OffCpuSpan> out;
  auto it = std::lower_bound(v.begin(), v.end(), a,
                             [](const OffCpu& o, uint64_t t) { return o.end <= t; });
  for (; it != v.end() && it->start < b; ++it) {
    const uint64_t lo = std::max(a, it->start), hi = std::min(b, it->end);
    if (hi > lo) out.push_back({lo, hi - lo, it->runnable});
  }
  return out;
}

double PercentileD(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

}  // namespace

std::string_view ToString(JointMapping m) noexcept {
  switch (m) {
    case JointMapping::kThreadByTime:
      return "thread-by-time";
    case JointMapping::kVcpuIndex:
      return "vcpu-index";
    case JointMapping::kThreadId:
      return "thread-id";
  }
  return "?";
}

JointBuilder::JointBuilder(const ClockCalibration& vmm_clock, JointOptions opts)
    : clock_(vmm_clock), opts_(opts) {}

void JointBuilder::AddVmm(const ExitEvent& e) {
  if (e.side != Side::kVmm) return;
  VmmVcpu& v = vcpus_[e.vcpu];
  if (e.end == ExitEnd::kOpenAtEnd) {
    v.in_progress = true;
    v.in_progress_start_ns = e.start_ns;
  } else if (e.end == ExitEnd::kSeen) {
    v.exits.emplace_back(e);
  }
}

void JointBuilder::AddKernel(const ExitEvent& e) {
  if (!e.userspace || e.kernel_access || e.end == ExitEnd::kNotTraced) return;
  kernel_exits_.emplace_back(e);
}

Result<JointView> JointBuilder::Finish(const std::string& trace_clock) {
  const JointOptions& opts = opts_;
  if (trace_clock != "x86-tsc") {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("the trace's clock is '{}', not x86-tsc: its timestamps cannot be "
                            "aligned with the dump's TSC (record with trace_clock x86-tsc, as "
                            "`exitscope kvm record` does)",
                            trace_clock.empty() ? "unknown" : trace_clock));
  }
  if (clock_.source != ClockSource::kTsc || clock_.tsc_hz == 0) {
    return Fail(ErrorCode::kInvalidArgument,
                "the dump's clock is CLOCK_MONOTONIC, not the TSC: its exits cannot be "
                "aligned with the trace's x86-tsc timestamps");
  }
  const Clock clock = Clock::FromCalibration(clock_);
  const uint64_t tol = opts.tolerance_ns;
  JointView view;
  view.tsc_hz = clock_.tsc_hz;
  OffCpuByThread off_cpu;
  if (!sched_.empty()) {
    // Records come per CPU, merged in time order: a thread's switches are then in order.
    std::stable_sort(sched_.begin(), sched_.end(),
                     [](const SchedSwitch& a, const SchedSwitch& b) { return a.ts < b.ts; });
    view.sched_recorded = true;
    view.sched_switches = sched_.size();
    off_cpu = BuildOffCpu(sched_, clock);
  }

  // The kernel's userspace exits, per thread, in the dump's nanoseconds.
  Threads threads;
  uint64_t k_lo = kOpen, k_hi = 0;
  for (const ExitEvent& e : kernel_exits_) {
    KernelExit k;
    k.start = clock.ToMonotonicNs(e.start_ns);
    if (e.end == ExitEnd::kSeen) k.end = clock.ToMonotonicNs(e.start_ns + e.duration_ns);
    k.e = &e;
    threads[e.tid].push_back(k);
    ++view.kernel_exits;
    k_lo = std::min(k_lo, k.start);
    k_hi = std::max(k_hi, k.end == kOpen ? k.start : k.end);
  }
  for (auto& [tid, v] : threads) {
    std::stable_sort(v.begin(), v.end(),
                     [](const KernelExit& a, const KernelExit& b) { return a.start < b.start; });
  }
  uint64_t d_lo = kOpen, d_hi = 0;
  for (const auto& [vcpu, v] : vcpus_) {
    for (const ExitEvent& d : v.exits) {
      ++view.vmm_exits;
      d_lo = std::min(d_lo, d.start_ns);
      d_hi = std::max(d_hi, d.start_ns + d.duration_ns);
    }
  }
  if (view.vmm_exits == 0) {
    return Fail(ErrorCode::kInvalidArgument, "the dump holds no completed exit to match");
  }
  if (view.kernel_exits == 0) {
    return Fail(ErrorCode::kInvalidArgument,
                "the trace holds no userspace exit to match (no kvm_userspace_exit records)");
  }
  if (d_hi + tol < k_lo || k_hi + tol < d_lo) {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("the dump's exits ({:.6f}..{:.6f} s) and the trace's ({:.6f}..{:.6f} "
                            "s, converted with the dump's TSC calibration) do not overlap in "
                            "time: not the same run, or not the same host's TSC",
                            static_cast<double>(d_lo) / 1e9, static_cast<double>(d_hi) / 1e9,
                            static_cast<double>(k_lo) / 1e9, static_cast<double>(k_hi) / 1e9));
  }

  // Which thread runs which vCPU: the dump's thread id where the trace has that thread's
  // exits; for the others, the vote of the VMM exits that one thread alone contains.
  std::map<uint32_t, uint32_t> tid_of_vcpu;
  std::set<uint32_t> taken;
  for (const auto& [vcpu, tid] : known_tids_) {
    auto t = threads.find(tid);
    if (tid == 0 || t == threads.end() || t->second.empty() || taken.count(tid) ||
        !vcpus_.count(vcpu)) {
      continue;
    }
    tid_of_vcpu[vcpu] = tid;
    taken.insert(tid);
    view.threads.push_back({vcpu, tid, t->second.front().e->vcpu, 0});
  }
  if (!tid_of_vcpu.empty()) view.mapping = JointMapping::kThreadId;
  std::map<uint32_t, std::map<uint32_t, uint64_t>> votes;
  for (const auto& [vcpu, v] : vcpus_) {
    if (tid_of_vcpu.count(vcpu)) continue;
    for (const ExitEvent& d : v.exits) {
      uint32_t only = 0;
      int n = 0;
      for (auto& [tid, exits] : threads) {
        if (Containing(exits, d.start_ns, d.start_ns + d.duration_ns, tol) != nullptr) {
          only = tid;
          ++n;
        }
      }
      if (n == 1) ++votes[vcpu][only];
    }
  }
  std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> ballots;  // votes, vcpu, tid
  for (const auto& [vcpu, per_tid] : votes) {
    for (const auto& [tid, n] : per_tid) ballots.emplace_back(n, vcpu, tid);
  }
  std::sort(ballots.begin(), ballots.end(), [](const auto& a, const auto& b) {
    return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) > std::get<0>(b) : a < b;
  });
  for (const auto& [n, vcpu, tid] : ballots) {
    if (tid_of_vcpu.count(vcpu) || taken.count(tid)) continue;
    tid_of_vcpu[vcpu] = tid;
    taken.insert(tid);
    view.threads.push_back({vcpu, tid, threads[tid].front().e->vcpu, n});
  }
  if (tid_of_vcpu.empty()) {
    // No exit nests anywhere: fall back to the kernel source's vCPU index, so the refusal
    // below reports what was tried.
    view.mapping = JointMapping::kVcpuIndex;
    for (auto& [tid, exits] : threads) {
      const uint32_t kv = exits.front().e->vcpu;
      if (!tid_of_vcpu.count(kv)) {
        tid_of_vcpu[kv] = tid;
        view.threads.push_back({kv, tid, kv, 0});
      }
    }
  }
  std::sort(view.threads.begin(), view.threads.end(),
            [](const JointVcpuThread& a, const JointVcpuThread& b) { return a.vcpu < b.vcpu; });

  // Match, per vCPU, in time order.
  std::vector<int64_t> offsets;
  for (const auto& [vcpu, v] : vcpus_) {
    auto mapped = tid_of_vcpu.find(vcpu);
    for (const ExitEvent& d : v.exits) {
      const uint64_t hs = d.start_ns, he = d.start_ns + d.duration_ns;
      JointUnmatched u{vcpu, 0, hs, d.duration_ns, DescribeVmm(d), ""};
      if (mapped == tid_of_vcpu.end()) {
        u.reason = kReasonUnmappedVcpu;
        view.unmatched_vmm.push_back(std::move(u));
        continue;
      }
      u.tid = mapped->second;
      std::vector<KernelExit>& exits = threads[mapped->second];
      KernelExit* k = Containing(exits, hs, he, tol);
      if (k == nullptr || k->used || k->end == kOpen) {
        const uint64_t first = exits.front().start;
        const uint64_t last = exits.back().end == kOpen ? exits.back().start : exits.back().end;
        if (k != nullptr && k->end == kOpen && !k->claimed) {
          k->claimed = true;
          u.reason = kReasonOpenAtEnd;
        } else if (k != nullptr && k->end == kOpen)
          u.reason = kReasonAfterTrace;
        else if (he <= first + tol)
          u.reason = kReasonBeforeTrace;
        else if (hs + tol >= last)
          u.reason = kReasonAfterTrace;
        else
          u.reason = kReasonNoKernelExit;
        view.unmatched_vmm.push_back(std::move(u));
        continue;
      }
      k->used = true;
      JointExit j;
      j.vcpu = vcpu;
      j.tid = mapped->second;
      j.kernel_start_ns = k->start;
      j.kernel_ns = k->end - k->start;
      j.handler_start_ns = hs;
      j.offset_ns = static_cast<int64_t>(hs) - static_cast<int64_t>(k->start);
      j.before_ns = std::min<uint64_t>(hs > k->start ? hs - k->start : 0, j.kernel_ns);
      j.handler_ns = std::min<uint64_t>(d.duration_ns, j.kernel_ns - j.before_ns);
      j.after_ns = j.kernel_ns - j.before_ns - j.handler_ns;
      j.handler_wall_ns = j.handler_ns;
      if (view.sched_recorded) {
        const auto it = off_cpu.find(j.tid);
        const std::vector<OffCpu>* ov = it == off_cpu.end() ? nullptr : &it->second;
        const uint64_t b0 = k->start, b1 = b0 + j.before_ns, b2 = b1 + j.handler_ns;
        const OffSplit ob = OffCpuIn(ov, b0, b1), oh = OffCpuIn(ov, b1, b2),
                       oa = OffCpuIn(ov, b2, k->end);
        j.before_ns -= ob.total;
        j.handler_ns -= oh.total;
        j.after_ns -= oa.total;
        j.off_cpu_ns = ob.total + oh.total + oa.total;
        j.off_cpu_runnable_ns = ob.runnable + oh.runnable + oa.runnable;
        if (ov != nullptr) j.off_cpu_spans = OffCpuSpans(*ov, k->start, k->end);
      }
      j.kind = std::string(ToString(d.kind));
      j.device = std::string(d.device);
      j.reg = std::string(d.reg);
      j.dir = DirName(d.dir);
      j.kernel_reason = std::string(k->e->user_reason);
      offsets.push_back(j.offset_ns);
      view.matched.push_back(std::move(j));
    }
  }
  std::sort(view.matched.begin(), view.matched.end(), [](const JointExit& a, const JointExit& b) {
    return a.kernel_start_ns < b.kernel_start_ns;
  });

  // Kernel exits nobody matched, each with its reason.
  std::map<uint32_t, std::pair<uint32_t, const VmmVcpu*>> vcpu_of_tid;  // tid -> vCPU
  for (const auto& [vcpu, v] : vcpus_) {
    if (auto it = tid_of_vcpu.find(vcpu); it != tid_of_vcpu.end()) {
      vcpu_of_tid[it->second] = {vcpu, &v};
    }
  }
  for (auto& [tid, exits] : threads) {
    const auto vit = vcpu_of_tid.find(tid);
    const VmmVcpu* v = vit == vcpu_of_tid.end() ? nullptr : vit->second.second;
    for (const KernelExit& k : exits) {
      if (k.used) continue;
      JointUnmatched u{v ? vit->second.first : k.e->vcpu,
                       tid,
                       k.start,
                       k.end == kOpen ? 0 : k.end - k.start,
                       DescribeKernel(*k.e),
                       ""};
      const bool has_progress = v && v->in_progress && v->in_progress_start_ns + tol >= k.start &&
                                (k.end == kOpen || v->in_progress_start_ns <= k.end + tol);
      if (v == nullptr) {
        u.reason = kReasonUnmappedThread;
      } else if (has_progress) {
        u.reason = kReasonInProgress;
      } else if (k.end == kOpen) {
        u.reason = kReasonOpenAtEnd;
      } else if (v->exits.empty() || k.end <= v->exits.front().start_ns + tol) {
        u.reason = kReasonBeforeDump;
      } else if (k.start + tol >= v->exits.back().start_ns + v->exits.back().duration_ns) {
        u.reason = kReasonAfterDump;
      } else {
        u.reason = kReasonNoVmmExit;
      }
      view.unmatched_kernel.push_back(std::move(u));
    }
  }

  const uint64_t smaller = std::min(view.vmm_exits, view.kernel_exits);
  const double fraction =
      static_cast<double>(view.matched.size()) / static_cast<double>(smaller ? smaller : 1);
  if (view.matched.empty() || fraction < opts.min_match_fraction) {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("the clocks cannot be aligned: only {} of {} VMM exits lie inside a "
                            "kernel exit of their vCPU thread ({} kernel userspace exits; need "
                            "{:.0f} %): a shifted or different TSC, or not the same run",
                            view.matched.size(), view.vmm_exits, view.kernel_exits,
                            opts.min_match_fraction * 100));
  }
  if (fraction < opts.warn_match_fraction) {
    view.warnings.push_back(
        fmt::format("only {:.1f} % of the smaller side matched", fraction * 100));
  }
  std::sort(offsets.begin(), offsets.end());
  view.offset.min_ns = offsets.front();
  view.offset.max_ns = offsets.back();
  view.offset.median_ns = offsets[(offsets.size() - 1) / 2];
  return view;
}

Result<JointView> BuildJointView(const Dump& dump, const std::vector<ExitEvent>& kernel,
                                 const std::string& trace_clock, const JointOptions& opts,
                                 const std::vector<SchedSwitch>* sched) {
  JointBuilder b(dump.clock, opts);
  for (const DumpVcpu& v : dump.vcpus) {
    if (v.tid > 0) b.SetThreadId(v.vcpu, static_cast<uint32_t>(v.tid));
  }
  sources::DumpSource(dump).Emit(b.vmm());
  for (const ExitEvent& e : kernel) b.kernel()->OnExit(e);
  if (sched != nullptr) {
    for (const SchedSwitch& s : *sched) b.OnSchedSwitch(s);
  }
  return b.Finish(trace_clock);
}

sources::SourceOptions JointTraceOptions(const Dump& dump, const sources::KvmDeviceMap* devices) {
  sources::SourceOptions so;
  so.input.tsc_khz = dump.clock.tsc_hz ? (dump.clock.tsc_hz + 500) / 1000 : 1;
  so.raw_clock = true;  // start_ns / duration_ns stay in the trace's ticks
  so.pairer.devices = devices;
  return so;
}

Result<JointView> BuildJointView(sources::Source& vmm, sources::Source& kernel,
                                 const JointOptions& opts) {
  const std::string names = fmt::format("{} + {}", vmm.info().name, kernel.info().name);
  const Dump* dump = vmm.dump();
  if (dump == nullptr || kernel.dump() != nullptr) {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: the joint view needs a recorder dump and a kernel trace", names));
  }
  JointBuilder b(dump->clock, opts);
  for (const DumpVcpu& v : dump->vcpus) {
    if (v.tid > 0) b.SetThreadId(v.vcpu, static_cast<uint32_t>(v.tid));
  }
  kernel.ObserveRecords(
      [](const sources::KvmRecord& r, void* ctx) {
        if (r.type != sources::KvmEventType::kSchedSwitch) return;
        // prev_state with no state bit set (the low byte) is TASK_RUNNING: preempted.
        static_cast<JointBuilder*>(ctx)->OnSchedSwitch({r.ts, static_cast<uint32_t>(r.prev_tid),
                                                        static_cast<uint32_t>(r.next_tid),
                                                        (r.prev_state & 0xff) == 0});
      },
      &b);
  if (Status s = vmm.Run(b.vmm()); !s) return Propagate(s);
  // Run ends with the pairer's Finish(): exits left open are emitted as kOpenAtEnd.
  if (Status s = kernel.Run(b.kernel()); !s) return Propagate(s);
  auto view = b.Finish(kernel.info().clock);
  if (!view) return Fail(view.error().code, fmt::format("{}: {}", names, view.error().message));
  view->trace_format = kernel.info().format;
  view->kernel_lost_events = kernel.pairing() ? kernel.pairing()->lost_events : 0;
  if (view->kernel_lost_events != 0) {
    view->warnings.push_back(
        fmt::format("the trace lost {} records (ring buffer overruns)", view->kernel_lost_events));
  }
  return view;
}

Result<JointView> BuildJointViewFromTrace(const Dump& dump, const std::string& dump_path,
                                          const std::string& trace_path, const JointOptions& opts) {
  auto devices = sources::KvmDeviceMap::LoadDump(dump_path);
  if (!devices) return Propagate(devices);
  auto trace = sources::OpenKernelTrace(trace_path, JointTraceOptions(dump, devices->get()));
  if (!trace) return Propagate(trace);
  auto vmm = sources::DumpAsSource(dump, dump_path);
  return BuildJointView(*vmm, **trace, opts);
}

JointGroups GroupJointExits(const std::vector<JointExit>& exits) {
  std::map<std::string, std::vector<const JointExit*>> kinds, devices, regs;
  for (const JointExit& j : exits) {
    kinds[j.kind].push_back(&j);
    // Only accesses (PIO, MMIO) have a device; other kinds (HLT, ...) group as "-".
    const bool access = j.kind == "PIO" || j.kind == "MMIO";
    const std::string dev = !access ? "-" : j.device.empty() ? "unassigned" : j.device;
    devices[dev].push_back(&j);
    std::string r = j.kind;
    if (access) r += " " + dev + (j.reg.empty() ? "" : "." + j.reg);
    if (!j.dir.empty()) r += " " + j.dir;
    regs[r].push_back(&j);
  }
  const auto build = [](const std::map<std::string, std::vector<const JointExit*>>& m) {
    std::vector<JointGroup> out;
    for (const auto& [key, list] : m) {
      JointGroup g;
      g.key = key;
      g.count = list.size();
      // The parts' percentiles are the shared latency histogram's (base/histogram.h, as every
      // other table's: within 0.78 %, exact when a group's values are all equal).
      auto hist = std::make_unique<base::LatencyHistogram>();
      const auto part = [&](uint64_t JointExit::*field) {
        std::vector<double> share;
        *hist = {};
        JointPart p;
        for (const JointExit* j : list) {
          hist->Add(j->*field);
          p.sum_ns += j->*field;
          share.push_back(j->kernel_ns
                              ? static_cast<double>(j->*field) / static_cast<double>(j->kernel_ns)
                              : 0.0);
        }
        p.p50_ns = hist->Quantile(0.50);
        p.p99_ns = hist->Quantile(0.99);
        p.share_p50 = PercentileD(share, 0.50);
        p.share_p99 = PercentileD(share, 0.99);
        return p;
      };
      g.total = part(&JointExit::kernel_ns);
      g.before = part(&JointExit::before_ns);
      g.handler = part(&JointExit::handler_ns);
      g.after = part(&JointExit::after_ns);
      g.off_cpu = part(&JointExit::off_cpu_ns);
      out.push_back(std::move(g));
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const JointGroup& a, const JointGroup& b) { return a.count > b.count; });
    return out;
  };
  JointGroups g;
  g.by_kind = build(kinds);
  g.by_device = build(devices);
  g.by_register = build(regs);
  return g;
}

std::vector<JointExit> SlowestJointExits(const std::vector<JointExit>& exits, size_t n) {
  std::vector<JointExit> out = exits;
  std::stable_sort(out.begin(), out.end(), [](const JointExit& a, const JointExit& b) {
    return a.kernel_ns > b.kernel_ns;
  });
  if (out.size() > n) out.resize(n);
  return out;
}

}  // namespace exitscope::analysis
