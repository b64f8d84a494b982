#include "report/timeline.h"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <tuple>

#include "base/output_file.h"
#include "base/text.h"
#include "exitscope/clock.h"
#include "report/format.h"
#include "sources/dump_source.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"
#include "sources/source.h"

namespace exitscope::report {
namespace {

constexpr size_t kFlushBytes = 1 << 20;

uint64_t TrackKey(uint32_t vm, uint32_t tid) noexcept {
  return (static_cast<uint64_t>(vm) << 32) | tid;
}

void AppendLower(std::string& out, std::string_view s) {
  for (char c : s) out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

// "nvme0.SQ1TDBL", "nvme0+0x2000", "unassigned 0xfeb00000", "0x1b" (MSR), "" (HLT).
void AppendTarget(std::string& out, const ExitEvent& e) {
  const bool access = e.subkey_kind == SubKeyKind::kPort || e.subkey_kind == SubKeyKind::kMmio;
  if (!e.device.empty()) {
    out += ' ';
    out += e.device;
    if (!e.reg.empty()) {
      out += '.';
      out += e.reg;
    } else if (e.device_offset != ExitEvent::kNoOffset) {
      fmt::format_to(std::back_inserter(out), "+{:#x}", e.device_offset);
    }
  } else if (access && e.userspace && e.kind != ExitKind::kUnknown) {
    fmt::format_to(std::back_inserter(out), " unassigned {:#x}", e.subkey);
  } else if (e.subkey_kind != SubKeyKind::kNone) {
    fmt::format_to(std::back_inserter(out), " {:#x}", e.subkey);
  }
}

}  // namespace

void AppendJsonString(std::string& out, std::string_view s) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c == '\n') {
      out += "\\n", ++i;
    } else if (c == '\t') {
      out += "\\t", ++i;
    } else if (c < 0x20 || c == 0x7f) {
      fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
      ++i;
    } else if (const size_t n = base::Utf8SequenceLength(s, i); n == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  out += '"';
}

TimelineWriter::TimelineWriter(std::FILE* out, TimelineOptions options)
    : out_(out), opts_(std::move(options)) {
  buf_.reserve(kFlushBytes + 4096);
}

void TimelineWriter::NameVm(uint32_t vm, std::string_view name) {
  vm_names_[vm] = std::string(name);
}

void TimelineWriter::NameTrack(uint32_t vm, uint32_t tid, std::string_view name) {
  track_names_[TrackKey(vm, tid)] = std::string(name);
}

void TimelineWriter::SetJointView(const analysis::JointView* view) {
  joint_ = view;
  by_handler_.clear();
  matched_kernel_.clear();
  if (view == nullptr) return;
  for (const analysis::JointExit& j : view->matched) {
    by_handler_[{j.vcpu, j.handler_start_ns}] = &j;
    matched_kernel_.insert({j.vcpu, j.kernel_start_ns});
  }
}

void TimelineWriter::Flush() {
  if (buf_.empty()) return;
  if (!write_failed_ && std::fwrite(buf_.data(), 1, buf_.size(), out_) != buf_.size()) {
    write_failed_ = true;
  }
  stats_.bytes += buf_.size();
  buf_.clear();
}

void TimelineWriter::BeginEvent() {
  if (!started_) {
    buf_ += "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
    started_ = true;
  }
  if (!first_) buf_ += ",\n";
  first_ = false;
  if (buf_.size() >= kFlushBytes) Flush();
}

bool TimelineWriter::InWindow(uint64_t abs_ns) const noexcept {
  const uint64_t t = abs_ns > opts_.base_ns ? abs_ns - opts_.base_ns : 0;
  return t >= opts_.from_ns && t < opts_.to_ns;
}

void TimelineWriter::Ts(uint64_t abs_ns) {
  const uint64_t t = abs_ns > opts_.base_ns ? abs_ns - opts_.base_ns : 0;
  fmt::format_to(std::back_inserter(buf_), "\"ts\":{}.{:03}", t / 1000, t % 1000);
}

void TimelineWriter::Dur(uint64_t ns) {
  fmt::format_to(std::back_inserter(buf_), ",\"dur\":{}.{:03}", ns / 1000, ns % 1000);
}

void TimelineWriter::Process(uint32_t vm) {
  if (!vms_.insert(vm).second) return;
  BeginEvent();
  fmt::format_to(std::back_inserter(buf_),
                 "{{\"ph\":\"M\",\"pid\":{},\"tid\":0,\"name\":\"process_name\",\"args\":{{"
                 "\"name\":",
                 vm);
  const auto it = vm_names_.find(vm);
  AppendJsonString(buf_, it != vm_names_.end() ? it->second : fmt::format("pid {}", vm));
  buf_ += "}}";
}

TimelineWriter::Track& TimelineWriter::TrackOf(uint32_t vm, uint32_t tid) {
  const uint64_t key = TrackKey(vm, tid);
  auto it = tracks_.find(key);
  if (it != tracks_.end()) return it->second;
  Process(vm);
  BeginEvent();
  fmt::format_to(std::back_inserter(buf_),
                 "{{\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"thread_name\",\"args\":{{"
                 "\"name\":",
                 vm, tid);
  const auto n = track_names_.find(key);
  AppendJsonString(buf_, n != track_names_.end() ? n->second : fmt::format("vCPU {}", tid));
  buf_ += "}}";
  BeginEvent();
  fmt::format_to(std::back_inserter(buf_),
                 "{{\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"thread_sort_index\","
                 "\"args\":{{\"sort_index\":{}}}}}",
                 vm, tid, tid);
  return tracks_[key];
}

void TimelineWriter::Slice(uint32_t vm, uint32_t tid, uint64_t start, uint64_t dur,
                           std::string_view name, std::string_view cat) {
  BeginEvent();
  fmt::format_to(std::back_inserter(buf_), "{{\"ph\":\"X\",\"pid\":{},\"tid\":{},", vm, tid);
  Ts(start);
  Dur(dur);
  buf_ += ",\"name\":";
  AppendJsonString(buf_, name);
  buf_ += ",\"cat\":";
  AppendJsonString(buf_, cat);
  buf_ += ",\"args\":{";
}

void TimelineWriter::CloseArgs() {
  if (buf_.back() == ',') buf_.pop_back();
  buf_ += "}}";
}

void TimelineWriter::Instant(uint32_t vm, uint32_t tid, bool thread_scope, uint64_t t,
                             std::string_view name, std::string_view cat) {
  if (thread_scope) {
    TrackOf(vm, tid);
  } else {
    Process(vm);
  }
  BeginEvent();
  fmt::format_to(std::back_inserter(buf_), "{{\"ph\":\"i\",\"s\":\"{}\",\"pid\":{},\"tid\":{},",
                 thread_scope ? 't' : 'p', vm, tid);
  Ts(t);
  buf_ += ",\"name\":";
  AppendJsonString(buf_, name);
  buf_ += ",\"cat\":";
  AppendJsonString(buf_, cat);
  buf_ += ",\"args\":{";
  ++stats_.instants;
}

bool TimelineWriter::Admit(uint32_t vm, uint32_t vcpu, uint64_t start, uint64_t dur) {
  if (!InWindow(start) || dur < opts_.min_duration_ns) {
    ++stats_.left_out;
    return false;
  }
  Track& t = TrackOf(vm, vcpu);
  const auto q = quota_.find(vcpu);
  if (q != quota_.end() ? t.exits >= q->second
                        : opts_.max_exits != 0 && drawn_ >= opts_.max_exits) {
    ++stats_.capped;
    return false;
  }
  ++t.exits;
  ++drawn_;
  return true;
}

uint64_t TimelineWriter::Clamp(Track& t, uint64_t* start, uint64_t* dur) {
  uint64_t clamped = 0;
  if (*start < t.last_end) {
    clamped = t.last_end - *start;
    *dur = *dur > clamped ? *dur - clamped : 0;
    *start = t.last_end;
    ++stats_.clamped;
  }
  t.last_end = *start + *dur;
  return clamped;
}

bool TimelineWriter::Selected(const ExitEvent& e) const noexcept {
  return !(opts_.only_vcpu >= 0 && e.vcpu != opts_.only_vcpu) &&
         !(opts_.only_pid >= 0 && e.vm != opts_.only_pid && e.tid != opts_.only_pid);
}

void TimelineWriter::OnExit(const ExitEvent& e) {
  if (!Selected(e)) {
    ++stats_.left_out;
    return;
  }
  if (joint_ != nullptr) {
    const auto it = by_handler_.find({e.vcpu, e.start_ns});
    kept_.push_back({e, false, it != by_handler_.end() ? it->second->kernel_start_ns : e.start_ns});
    return;
  }
  DrawVmmExit(e);
}

void TimelineWriter::OnKernelExit(const ExitEvent& e) {
  if (!Selected(e)) {
    ++stats_.left_out;
    return;
  }
  if (e.kernel_access || e.end != ExitEnd::kSeen) {
    ++stats_.not_drawn;
    return;
  }
  if (joint_ != nullptr) {
    kept_.push_back({e, true, e.start_ns});
    return;
  }
  DrawKernelExit(e);
}

// The args every exit slice carries (the caller opened args).
namespace {
void AppendExitArgs(std::string& buf, const ExitEvent& e, uint64_t clamped) {
  auto out = std::back_inserter(buf);
  if (e.subkey_kind != SubKeyKind::kNone) fmt::format_to(out, "\"address\":\"{:#x}\",", e.subkey);
  if (e.size != 0) fmt::format_to(out, "\"size\":{},", e.size);
  fmt::format_to(out, "\"duration_ns\":{},", e.duration_ns);
  if (e.dir != AccessDir::kNone) fmt::format_to(out, "\"dir\":\"{}\",", ToString(e.dir));
  if ((e.flags & kExitFlagValue) != 0) fmt::format_to(out, "\"value\":\"{:#x}\",", e.value);
  if ((e.flags & kExitFlagSlow) != 0) buf += "\"slow\":true,";
  if ((e.flags & kExitFlagStalled) != 0) buf += "\"stalled\":true,";
  if (e.end == ExitEnd::kOpenAtEnd) buf += "\"in_progress\":true,";
  if (e.tid != 0) fmt::format_to(out, "\"thread\":{},", e.tid);
  if (clamped != 0) fmt::format_to(out, "\"clamped_ns\":{},", clamped);
}
}  // namespace

void TimelineWriter::DrawVmmExit(const ExitEvent& e) {
  if (!Admit(e.vm, e.vcpu, e.start_ns, e.duration_ns)) return;
  Track& t = TrackOf(e.vm, e.vcpu);
  uint64_t start = e.start_ns, dur = e.duration_ns;
  const uint64_t clamped = Clamp(t, &start, &dur);
  name_.clear();
  AppendLower(name_, e.reason);
  AppendTarget(name_, e);
  Slice(e.vm, e.vcpu, start, dur, name_, "exit");
  AppendExitArgs(buf_, e, clamped);
  CloseArgs();
  ++stats_.vmm_exits;
}

void TimelineWriter::DrawKernelExit(const ExitEvent& e) {
  if (!Admit(e.vm, e.vcpu, e.start_ns, e.duration_ns)) return;
  Track& t = TrackOf(e.vm, e.vcpu);
  uint64_t start = e.start_ns, dur = e.duration_ns;
  const uint64_t clamped = Clamp(t, &start, &dur);
  name_.clear();
  if (joint_ != nullptr) name_ += "kernel ";
  AppendLower(name_, e.userspace && !e.user_reason.empty() ? e.user_reason : e.reason);
  AppendTarget(name_, e);
  Slice(e.vm, e.vcpu, start, dur, name_, "kernel");
  AppendExitArgs(buf_, e, clamped);
  if (!e.userspace) buf_ += "\"in_kernel\":true,";
  CloseArgs();
  ++stats_.kernel_exits;
}

void TimelineWriter::DrawJointExit(const ExitEvent& e, const analysis::JointExit& j) {
  if (!Admit(e.vm, e.vcpu, j.kernel_start_ns, j.kernel_ns)) return;
  Track& t = TrackOf(e.vm, e.vcpu);
  uint64_t ks = j.kernel_start_ns, kd = j.kernel_ns;
  const uint64_t clamped = Clamp(t, &ks, &kd);
  const uint64_t ke = ks + kd;
  // The parts as the joint view splits the kernel's time (wall time, off-CPU included):
  // [b0, b1) kernel before, [b1, b2) handler, [b2, ke) kernel after; clipped to the parent.
  const uint64_t before = std::min<uint64_t>(
      j.handler_start_ns > j.kernel_start_ns ? j.handler_start_ns - j.kernel_start_ns : 0,
      j.kernel_ns);
  const uint64_t b0 = ks;
  const uint64_t b1 = std::clamp(j.kernel_start_ns + before, ks, ke);
  const uint64_t b2 = std::clamp(j.kernel_start_ns + before + j.handler_wall_ns, b1, ke);

  name_ = "kernel ";
  AppendLower(name_, j.kernel_reason.empty() ? std::string_view(e.reason) : j.kernel_reason);
  AppendTarget(name_, e);
  Slice(e.vm, e.vcpu, ks, kd, name_, "kernel");
  auto out = std::back_inserter(buf_);
  fmt::format_to(out,
                 "\"duration_ns\":{},\"before_ns\":{},\"handler_ns\":{},\"after_ns\":{},"
                 "\"thread\":{},",
                 j.kernel_ns, j.before_ns, j.handler_ns, j.after_ns, j.tid);
  if (joint_->sched_recorded) {
    fmt::format_to(out, "\"off_cpu_ns\":{},\"off_cpu_runnable_ns\":{},", j.off_cpu_ns,
                   j.off_cpu_runnable_ns);
  }
  if (clamped != 0) fmt::format_to(out, "\"clamped_ns\":{},", clamped);
  CloseArgs();
  ++stats_.kernel_exits;
  ++stats_.joint_exits;

  const auto part = [&](uint64_t a, uint64_t b, std::string_view name, bool handler) {
    if (b <= a) return;
    if (handler) {
      std::string n;
      AppendLower(n, e.reason);
      AppendTarget(n, e);
      Slice(e.vm, e.vcpu, a, b - a, n, "exit");
      // The handler as the dump timed it; clamped_ns when the joint view's tolerance put it
      // (a few ns) outside the kernel exit.
      const uint64_t lost = e.duration_ns > b - a ? e.duration_ns - (b - a) : 0;
      AppendExitArgs(buf_, e, lost);
      ++stats_.vmm_exits;
    } else {
      Slice(e.vm, e.vcpu, a, b - a, name, "kernel");
      fmt::format_to(std::back_inserter(buf_), "\"duration_ns\":{},", b - a);
    }
    CloseArgs();
    for (const analysis::JointExit::OffCpuSpan& s : j.off_cpu_spans) {
      const uint64_t lo = std::max(a, s.start_ns), hi = std::min(b, s.start_ns + s.duration_ns);
      if (hi <= lo) continue;
      Slice(e.vm, e.vcpu, lo, hi - lo, s.runnable ? "off-CPU (preempted)" : "off-CPU (sleeping)",
            "sched");
      fmt::format_to(std::back_inserter(buf_), "\"duration_ns\":{},\"runnable\":{}", hi - lo,
                     s.runnable);
      CloseArgs();
      ++stats_.off_cpu_spans;
    }
  };
  part(b0, b1, "kernel before", false);
  part(b1, b2, "", true);
  part(b2, ke, "kernel after", false);
}

void TimelineWriter::OnDeviceEvent(const DeviceEvent& d) {
  const bool in_window = InWindow(d.time_ns);
  const uint32_t vm = opts_.vm;
  const std::string_view device = d.device.empty() ? std::string_view("unassigned") : d.device;
  auto out = std::back_inserter(buf_);
  switch (d.type) {
    case DeviceEventType::kIoSubmit: {
      OpenIo& io = open_io_[{std::string(device), d.io_id}];
      io = {d.time_ns, in_window};
      if (!in_window) return;
      Process(vm);
      BeginEvent();
      fmt::format_to(out, "{{\"ph\":\"b\",\"pid\":{},\"tid\":0,", vm);
      Ts(d.time_ns);
      fmt::format_to(out, ",\"id\":\"{:#x}\",\"name\":", d.io_id);
      AppendJsonString(buf_, fmt::format("{} io", device));
      buf_ += ",\"cat\":";
      AppendJsonString(buf_, device);
      fmt::format_to(out, ",\"args\":{{\"io_id\":{}}}}}", d.io_id);
      return;
    }
    case DeviceEventType::kIoComplete: {
      const auto it = open_io_.find({std::string(device), d.io_id});
      if (it == open_io_.end()) {
        ++stats_.io_completions_unpaired;
        if (!in_window) return;
        Instant(vm, 0, false, d.time_ns,
                fmt::format("io-complete {} (submit not recorded)", device), device);
        fmt::format_to(out, "\"io_id\":{},\"status\":{}", d.io_id, d.status);
        CloseArgs();
        return;
      }
      const OpenIo io = it->second;
      open_io_.erase(it);
      if (!io.written) return;
      BeginEvent();
      fmt::format_to(out, "{{\"ph\":\"e\",\"pid\":{},\"tid\":0,", vm);
      Ts(std::max(d.time_ns, io.start_ns));
      fmt::format_to(out, ",\"id\":\"{:#x}\",\"name\":", d.io_id);
      AppendJsonString(buf_, fmt::format("{} io", device));
      buf_ += ",\"cat\":";
      AppendJsonString(buf_, device);
      fmt::format_to(out, ",\"args\":{{\"status\":{},\"latency_ns\":{}}}}}", d.status,
                     d.time_ns > io.start_ns ? d.time_ns - io.start_ns : 0);
      ++stats_.io_slices;
      return;
    }
    case DeviceEventType::kQueueFull:
    case DeviceEventType::kBackendError:
    case DeviceEventType::kNote: {
      if (!in_window) return;
      Instant(vm, 0, false, d.time_ns, fmt::format("{} {}", ToString(d.type), device), device);
      if (d.type == DeviceEventType::kQueueFull) {
        fmt::format_to(out, "\"queue\":{},", d.io_id);
      } else {
        fmt::format_to(out, "\"io_id\":{},\"status\":{},", d.io_id, d.status);
      }
      if (!d.note.empty()) {
        buf_ += "\"note\":";
        AppendJsonString(buf_, d.note);
      }
      CloseArgs();
      return;
    }
  }
}

void TimelineWriter::OnFinding(const Finding& f) {
  if (!InWindow(f.time_ns)) return;
  std::string name(ToString(f.type));
  if (!f.device.empty()) name += " " + std::string(f.device) + (f.reg.empty() ? "" : ".");
  name += f.reg;
  const bool on_vcpu = f.type != FindingType::kAgedIo;
  Instant(opts_.vm, on_vcpu ? f.vcpu : 0, on_vcpu, f.time_ns, name, "finding");
  auto out = std::back_inserter(buf_);
  fmt::format_to(out, "\"duration_ns\":{},", f.duration_ns);
  if (f.type == FindingType::kAgedIo) fmt::format_to(out, "\"io_id\":{},", f.io_id);
  if (!f.text.empty()) {
    buf_ += "\"text\":";
    AppendJsonString(buf_, f.text);
    buf_ += ',';
  }
  if (f.stack != nullptr) {
    // The stuck thread's frames, innermost first (kernel, then user), as FormatFrame writes
    // them; its thread id, state and note.
    fmt::format_to(out, "\"tid\":{},\"state\":", f.stack->tid);
    AppendJsonString(buf_, StackStateText(f.stack->state));
    buf_ += ",\"frames\":[";
    bool first = true;
    for (const std::string& frame : StackFrameLines(*f.stack)) {
      if (!first) buf_ += ',';
      first = false;
      AppendJsonString(buf_, frame);
    }
    buf_ += "],";
    if (!f.stack->note.empty()) {
      buf_ += "\"stack_note\":";
      AppendJsonString(buf_, f.stack->note);
    }
  }
  CloseArgs();
}

void TimelineWriter::DrawOffCpuExits(const analysis::OffCpuSlowExits& s) {
  offcpu_drawn_ = true;
  std::vector<const analysis::OffCpuSlowExit*> order;
  for (const analysis::OffCpuSlowExit& x : s.exits()) order.push_back(&x);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return std::tie(a->exit.tgid, a->exit.tid, a->exit.start_ns) <
           std::tie(b->exit.tgid, b->exit.tid, b->exit.start_ns);
  });
  const auto frames = [&](std::string_view key, const std::vector<StackFrame>& fs) {
    buf_ += '"';
    buf_ += key;
    buf_ += "\":[";
    for (size_t i = 0; i < fs.size(); ++i) {
      if (i) buf_ += ',';
      AppendJsonString(buf_, FormatFrame(fs[i]));
    }
    buf_ += "],";
  };
  for (const analysis::OffCpuSlowExit* x : order) {
    const sources::bpf::OffCpuExit& e = x->exit;
    if (!track_names_.count(TrackKey(e.tgid, e.tid)))  // before Admit writes the track
      NameTrack(e.tgid, e.tid, fmt::format("thread {}", e.tid));
    if (!Admit(e.tgid, e.tid, e.start_ns, x->inside_ns())) continue;
    Track& t = TrackOf(e.tgid, e.tid);
    uint64_t start = e.start_ns, dur = x->inside_ns();
    const uint64_t clamped = Clamp(t, &start, &dur);
    Slice(
        e.tgid, e.tid, start, dur,
        fmt::format("{} exit ({})", x->stuck ? "stuck" : "slow", analysis::OffCpuKindText(e.kind)),
        "kernel-seen");
    fmt::format_to(std::back_inserter(buf_),
                   "\"inside_ns\":{},\"off_cpu_ns\":{},\"switches\":{},\"stack_drops\":{},"
                   "\"other_off_cpu_ns\":{},\"other_switches\":{},\"stuck\":{},",
                   x->inside_ns(), e.off_ns, e.switches, e.stack_drops, e.other_off_ns,
                   e.other_switches, x->stuck);
    if (clamped) fmt::format_to(std::back_inserter(buf_), "\"clamped_ns\":{},", clamped);
    CloseArgs();
    ++stats_.offcpu_exits;
    const uint64_t end = start + dur;
    uint64_t at = start;
    for (size_t i = 0; i < e.sites.size() && i < x->stacks.size(); ++i) {
      const sources::bpf::OffCpuSite& site = e.sites[i];
      const ThreadStack& st = x->stacks[i];
      const uint64_t d = std::min(site.off_ns, end - at);
      const StackFrame* k = analysis::BlockingKernelFrame(st);
      Slice(e.tgid, e.tid, at, d,
            fmt::format("off the CPU{}", k ? " in " + k->function : std::string()), "off-cpu");
      fmt::format_to(std::back_inserter(buf_),
                     "\"off_cpu_ns\":{},\"switches\":{},\"preempted\":{},\"in_progress\":{},"
                     "\"laid_out\":\"the places one after the other from the exit's start, "
                     "longest first: the program keeps each one's total, not when\",",
                     site.off_ns, site.switches, site.preempted, site.in_progress);
      frames("kernel", st.kernel);
      frames("user", st.user);
      if (!st.note.empty()) {
        buf_ += "\"note\":";
        AppendJsonString(buf_, st.note);
        buf_ += ',';
      }
      CloseArgs();
      ++stats_.offcpu_sites;
      at += d;
    }
  }
}

Status TimelineWriter::Finish(uint64_t end_ns) {
  if (joint_ != nullptr) {
    std::stable_sort(kept_.begin(), kept_.end(), [](const Kept& a, const Kept& b) {
      return std::tie(a.e.vm, a.e.vcpu, a.draw_start) < std::tie(b.e.vm, b.e.vcpu, b.draw_start);
    });
    for (const Kept& k : kept_) {
      if (k.kernel) {
        if (!matched_kernel_.count({k.e.vcpu, k.e.start_ns})) DrawKernelExit(k.e);
        continue;
      }
      const auto it = by_handler_.find({k.e.vcpu, k.e.start_ns});
      if (it != by_handler_.end() && k.e.end == ExitEnd::kSeen) {
        DrawJointExit(k.e, *it->second);
      } else {
        DrawVmmExit(k.e);
      }
    }
    kept_.clear();
  }
  for (const auto& [key, io] : open_io_) {
    if (!io.written) continue;
    BeginEvent();
    auto out = std::back_inserter(buf_);
    fmt::format_to(out, "{{\"ph\":\"e\",\"pid\":{},\"tid\":0,", opts_.vm);
    Ts(std::max(end_ns, io.start_ns));
    fmt::format_to(out, ",\"id\":\"{:#x}\",\"name\":", key.second);
    AppendJsonString(buf_, fmt::format("{} io", key.first));
    buf_ += ",\"cat\":";
    AppendJsonString(buf_, key.first);
    buf_ += ",\"args\":{\"in_flight_at_end\":true}}";
    ++stats_.io_in_flight_at_end;
    ++stats_.io_slices;
  }
  open_io_.clear();
  if (!started_) buf_ += "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  started_ = true;
  buf_ += "\n],\n\"otherData\":{";
  auto out = std::back_inserter(buf_);
  for (const auto& [k, v] : opts_.other_data) {
    AppendJsonString(buf_, k);
    buf_ += ':';
    AppendJsonString(buf_, v);
    buf_ += ',';
  }
  if (offcpu_drawn_) {
    fmt::format_to(out, "\"kernel_seen_exits\":\"{}\",\"off_cpu_sites\":\"{}\",",
                   stats_.offcpu_exits, stats_.offcpu_sites);
  }
  fmt::format_to(out,
                 "\"base_ns\":\"{}\",\"vmm_exits\":\"{}\",\"kernel_exits\":\"{}\","
                 "\"joint_exits\":\"{}\",\"exits_left_out\":\"{}\",\"exits_capped\":\"{}\","
                 "\"exits_clamped\":\"{}\",\"io_slices\":\"{}\",\"instants\":\"{}\"}}}}\n",
                 opts_.base_ns, stats_.vmm_exits, stats_.kernel_exits, stats_.joint_exits,
                 stats_.left_out, stats_.capped, stats_.clamped, stats_.io_slices, stats_.instants);
  Flush();
  if (!write_failed_ && std::fflush(out_) != 0) write_failed_ = true;
  if (write_failed_) {
    return Fail(ErrorCode::kIo, fmt::format("write failed: {}", std::strerror(errno)));
  }
  return {};
}

namespace {

// A track of a kernel thread that runs no vCPU of the dump (joint view): kThreadTrack + tid.
constexpr uint32_t kThreadTrack = 1'000'000;

// The earliest time a dump holds (its exits, device events, findings).
uint64_t FirstTime(const Dump& d) {
  uint64_t t = std::numeric_limits<uint64_t>::max();
  for (const DumpVcpu& v : d.vcpus) {
    if (!v.exits.empty()) t = std::min(t, v.exits.front().start_ns);
    if (v.in_progress) t = std::min(t, v.in_progress->start_ns);
  }
  if (!d.device_events.empty()) t = std::min(t, d.device_events.front().time_ns);
  for (const FindingRecord& f : d.findings) t = std::min(t, f.time_ns);
  return t == std::numeric_limits<uint64_t>::max() ? d.monotonic_ns : t;
}

// A dump's vCPUs arrive one after the other: each gets a share of max_exits in proportion to
// its exits, so a cap never leaves the last vCPUs out.
void SetQuotas(const Dump& d, uint64_t max_exits, TimelineWriter* w) {
  uint64_t total = 0;
  for (const DumpVcpu& v : d.vcpus) total += v.exits.size() + (v.in_progress ? 1 : 0);
  if (max_exits == 0 || total <= max_exits) return;
  for (const DumpVcpu& v : d.vcpus) {
    const uint64_t n = v.exits.size() + (v.in_progress ? 1 : 0);
    w->SetVcpuQuota(v.vcpu,
                    static_cast<uint64_t>(static_cast<unsigned __int128>(max_exits) * n / total));
  }
}

std::string VmName(const Dump& d) {
  return fmt::format("{} (pid {})", d.process.comm.empty() ? "VMM" : d.process.comm, d.process.pid);
}

// The kernel trace's exits on the joint view's tracks: times from raw x86-tsc ticks to the
// dump's CLOCK_MONOTONIC ns (the dump's calibration, as BuildJointView converts them), each
// thread on the track of the dump vCPU it runs.
class JointKernelSink : public EventSink {
 public:
  JointKernelSink(const Clock& clock, const analysis::JointView& view, uint32_t vm,
                  report::TimelineWriter* w)
      : clock_(clock), vm_(vm), w_(w) {
    for (const analysis::JointVcpuThread& t : view.threads) vcpu_of_tid_[t.tid] = t.vcpu;
  }
  void OnExit(const ExitEvent& k) override {
    ExitEvent e = k;
    e.start_ns = clock_.ToMonotonicNs(k.start_ns);
    if (k.end == ExitEnd::kSeen) {
      e.duration_ns = clock_.ToMonotonicNs(k.start_ns + k.duration_ns) - e.start_ns;
    }
    e.vm = vm_;
    if (const auto it = vcpu_of_tid_.find(k.tid); it != vcpu_of_tid_.end()) {
      e.vcpu = it->second;
    } else {
      e.vcpu = kThreadTrack + k.tid;
      if (named_.insert(k.tid).second) {
        w_->NameTrack(vm_, e.vcpu, fmt::format("thread {} (no vCPU of the dump)", k.tid));
      }
    }
    if (!k.kernel_access && k.end == ExitEnd::kSeen) first_ = std::min(first_, e.start_ns);
    w_->kernel_sink()->OnExit(e);
  }
  uint64_t first() const noexcept { return first_; }

 private:
  Clock clock_;
  uint32_t vm_;
  report::TimelineWriter* w_;
  std::map<uint32_t, uint32_t> vcpu_of_tid_;
  std::set<uint32_t> named_;
  uint64_t first_ = std::numeric_limits<uint64_t>::max();
};

// The output file, by the one output rule (base/output_file.h): TimelineWriter writes through
// a stdio stream on it; Close commits it, or after a failure leaves the path as it was.
struct Output {
  base::OutputFile file;
  std::FILE* f = nullptr;
  ~Output() {
    if (f != nullptr && f != stdout) std::fclose(f);
  }
  Status Close(Status s) {
    const bool failed = f == stdout ? std::fflush(f) != 0 : std::fclose(f) != 0;
    const int err = errno;
    f = nullptr;
    if (s && failed) {
      s = Fail(ErrorCode::kIo,
               fmt::format("{}: write failed: {}", file.path(), std::strerror(err)));
    }
    if (s) s = file.Commit();
    return s;  // not committed: the destructor of `file` removes only its temporary file
  }
};

Result<std::unique_ptr<Output>> Create(const std::string& path) {
  auto out = std::make_unique<Output>();
  if (Status s = out->file.Open(path, {.what = "a timeline"}); !s) return Propagate(s);
  if (out->file.is_stdout()) {
    out->f = stdout;
    return out;
  }
  const int fd = ::dup(out->file.fd());
  out->f = fd < 0 ? nullptr : ::fdopen(fd, "w");
  if (out->f == nullptr) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot create: {}", path, std::strerror(err)));
  }
  return out;
}

Status Named(Status s, const std::string& path) {
  if (s) return s;
  return Fail(s.error().code, fmt::format("{}: {}", path, s.error().message));
}

}  // namespace

Result<TimelineStats> WriteTimeline(const TimelineInputs& in, TimelineOptions o,
                                    const std::string& out_path) {
  const Dump* dump = in.dump;
  if (dump != nullptr) {
    o.vm = static_cast<uint32_t>(dump->process.pid);
    o.other_data.push_back({"dump", in.dump_path});
    o.other_data.push_back({"clock", "CLOCK_MONOTONIC ns of the recording host"});
    o.other_data.push_back({"includes_guest_data", dump->includes_guest_data ? "true" : "false"});
    o.other_data.push_back(
        {"slow_exit_threshold_ns", std::to_string(dump->slow_exit_threshold_ns)});
  }
  if (in.trace == nullptr && dump == nullptr && in.offcpu != nullptr) {  // kvm stat --stacks
    o.other_data.push_back({"clock", "CLOCK_MONOTONIC ns of this host"});
    o.other_data.push_back({"source", "kvm stat --bpf --stacks: slow exits seen from the kernel"});
    o.other_data.push_back({"kernel_slow_exits_seen", std::to_string(in.offcpu->seen())});
    o.other_data.push_back({"kernel_slow_exits_left_out", std::to_string(in.offcpu->left_out())});
    auto out = Create(out_path);
    if (!out) return Propagate(out);
    TimelineWriter w((*out)->f, o);
    uint64_t first = 0;
    for (const analysis::OffCpuSlowExit& x : in.offcpu->exits())
      first = first == 0 ? x.exit.start_ns : std::min(first, x.exit.start_ns);
    w.SetBase(first);
    w.DrawOffCpuExits(*in.offcpu);
    if (Status s = (*out)->Close(Named(w.Finish(0), out_path)); !s) return Propagate(s);
    return w.stats();
  }
  if (in.trace == nullptr) {  // a dump alone
    if (dump == nullptr) return Fail(ErrorCode::kInvalidArgument, "no input");
    auto out = Create(out_path);
    if (!out) return Propagate(out);
    TimelineWriter w((*out)->f, o);
    w.SetBase(FirstTime(*dump));
    w.NameVm(o.vm, VmName(*dump));
    SetQuotas(*dump, o.max_exits, &w);
    sources::DumpSource src(*dump);
    src.Emit(&w);
    if (Status s = (*out)->Close(Named(w.Finish(dump->monotonic_ns), out_path)); !s) {
      return Propagate(s);
    }
    return w.stats();
  }

  if (dump != nullptr && in.joint == nullptr) {
    return Fail(ErrorCode::kInvalidArgument, "a dump and a trace: the joint view is missing");
  }
  sources::Source& trace = *in.trace;
  struct First {
    TimelineWriter* w = nullptr;
    sources::ClockScale scale;
    bool seen = false;
  } first;
  if (dump == nullptr) {  // a trace alone: ts 0 is its first record
    trace.ObserveRecords(
        [](const sources::KvmRecord& r, void* ctx) {
          auto* f = static_cast<First*>(ctx);
          if (f->seen) return;
          f->seen = true;
          f->w->SetBase(f->scale.ToNs(r.ts));
        },
        &first);
  }
  const std::string trace_path = trace.info().name;
  o.other_data.push_back({"trace", trace_path});
  o.other_data.push_back({"trace_format", trace.info().format});
  o.other_data.push_back({"trace_clock", trace.info().clock});

  auto out = Create(out_path);
  if (!out) return Propagate(out);
  TimelineWriter w((*out)->f, o);
  if (dump == nullptr) {
    first.w = &w;
    first.scale = trace.info().scale;
    Status s = Named(trace.Run(w.kernel_sink()), trace_path);
    if (s) s = Named(w.Finish(0), out_path);
    if (s = (*out)->Close(std::move(s)); !s) return Propagate(s);
    return w.stats();
  }

  // The joint view: the trace's exits in the dump's ns on the dump's vCPU tracks.
  w.SetJointView(in.joint);
  w.NameVm(o.vm, VmName(*dump));
  SetQuotas(*dump, o.max_exits, &w);
  JointKernelSink ksink(Clock::FromCalibration(dump->clock), *in.joint, o.vm, &w);
  Status s = Named(trace.Run(&ksink), trace_path);
  if (s) {
    w.SetBase(std::min(FirstTime(*dump), ksink.first()));
    sources::DumpSource src(*dump);
    src.Emit(&w);
    s = Named(w.Finish(dump->monotonic_ns), out_path);  // while src's names live
  }
  if (s = (*out)->Close(std::move(s)); !s) return Propagate(s);
  return w.stats();
}

}  // namespace exitscope::report
