// `exitscope timeline INPUT... -o OUT`: the exit timeline of a recorder dump, a kernel trace or
// both (the joint view) as Trace Event JSON for ui.perfetto.dev / chrome://tracing
// (docs/timeline.md). Every input goes through the one event stream into
// report::TimelineWriter: sources::DumpSource for a dump, KvmInput -> KvmPairer for a trace.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "analysis/joint_view.h"
#include "cli/commands.h"
#include "cli/parse_args.h"
#include "exitscope/clock.h"
#include "exitscope/dump.h"
#include "report/timeline.h"
#include "sources/dump_source.h"
#include "sources/kvm_device_map.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"

namespace exitscope::cli {
namespace {

constexpr const char* kSelf = "exitscope timeline";
// A track of a kernel thread that runs no vCPU of the dump (joint view): kThreadTrack + tid.
constexpr uint32_t kThreadTrack = 1'000'000;

// Whether `path` starts with the dump magic; kNotFound / kIo naming the file otherwise.
Result<bool> IsDump(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return Fail(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  char magic[8] = {};
  const size_t n = std::fread(magic, 1, sizeof magic, f);
  std::fclose(f);
  return n == sizeof magic && std::memcmp(magic, "EXSCDUMP", sizeof magic) == 0;
}

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

std::string VmName(const Dump& d) {
  return fmt::format("{} (pid {})", d.process.comm.empty() ? "VMM" : d.process.comm, d.process.pid);
}

void DumpOtherData(const Dump& d, const std::string& path, report::TimelineOptions* o) {
  o->other_data.push_back({"dump", path});
  o->other_data.push_back({"clock", "CLOCK_MONOTONIC ns of the recording host, ts 0 = base_ns"});
  o->other_data.push_back({"includes_guest_data", d.includes_guest_data ? "true" : "false"});
  o->other_data.push_back({"slow_exit_threshold_ns", std::to_string(d.slow_exit_threshold_ns)});
}

int Finish(report::TimelineWriter& w, uint64_t end_ns, const std::string& out_path,
           std::FILE* out) {
  const Status s = w.Finish(end_ns);
  const bool close_failed = out != stdout && std::fclose(out) != 0;
  if (!s || close_failed) {
    std::fprintf(stderr, "%s: %s: %s\n", kSelf, out_path.c_str(),
                 !s ? s.error().message.c_str() : "close failed");
    return 1;
  }
  const report::TimelineStats& st = w.stats();
  std::fprintf(stderr,
               "%s: wrote %s: %llu bytes, %llu VMM exits, %llu kernel exits (%llu split), %llu "
               "I/O slices, %llu instants",
               kSelf, out_path.c_str(), static_cast<unsigned long long>(st.bytes),
               static_cast<unsigned long long>(st.vmm_exits),
               static_cast<unsigned long long>(st.kernel_exits),
               static_cast<unsigned long long>(st.joint_exits),
               static_cast<unsigned long long>(st.io_slices),
               static_cast<unsigned long long>(st.instants));
  if (st.left_out != 0) {
    std::fprintf(stderr, "; %llu exits outside --from/--to or below the duration filter",
                 static_cast<unsigned long long>(st.left_out));
  }
  if (st.capped != 0) {
    std::fprintf(stderr, "; %llu exits left out by --max-exits (narrow with --from/--to)",
                 static_cast<unsigned long long>(st.capped));
  }
  std::fprintf(stderr, "\n");
  return 0;
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

}  // namespace

int TimelineMain(int argc, char** argv) {
  CLI::App app{
      "Write the exit timeline of a recorder dump, a kernel trace, or one of each (the joint\n"
      "view) as Trace Event JSON: open it in ui.perfetto.dev or chrome://tracing. One track\n"
      "per vCPU with every exit as a slice named by kind and device.register, device I/O as\n"
      "async slices from submit to complete, instants for queue-full, backend errors and\n"
      "watchdog findings; in the joint view each exit split into kernel before / handler /\n"
      "kernel after (and off-CPU where the trace recorded sched_switch).",
      argv[0]};
  std::vector<std::string> inputs;
  std::string out_path;
  double from_s = 0, to_s = -1, min_us = 0;
  bool slow_only = false;
  uint64_t max_exits = 1'000'000;
  app.add_option("INPUT", inputs,
                 "a recorder dump (.esdump), a kernel trace (trace-cmd .dat, trace-cmd report / "
                 "ftrace / perf script text), or one of each; detected by content")
      ->required()
      ->expected(1, 2);
  app.add_option("-o,--output", out_path, "the JSON file to write ('-': standard output)")
      ->required();
  app.add_option("--from", from_s, "only from this many seconds after the timeline's start")
      ->check(kFiniteNonNegative);
  app.add_option("--to", to_s, "only until this many seconds after the timeline's start")
      ->check(kFiniteNonNegative);
  app.add_option("--min-us", min_us, "only exits at least this many microseconds long")
      ->check(kFiniteNonNegative);
  app.add_flag("--slow-only", slow_only,
               "only the exits at or above the dump's slow-exit threshold");
  app.add_option("--max-exits", max_exits,
                 "at most this many exit slices per vCPU, the first in time order (0 = all); "
                 "the file stays loadable in ui.perfetto.dev")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  app.footer(
      "Exit status: 0 ok, 1 a runtime failure (e.g. a write error), 2 bad usage or a missing, "
      "corrupt or unsupported input.\nFile contents and how to open it: docs/timeline.md.");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  if (to_s >= 0 && to_s <= from_s) return UsageError(kSelf, "--to: must be after --from");

  std::string dump_path, trace_path;
  for (const std::string& in : inputs) {
    auto is_dump = IsDump(in);
    if (!is_dump) return ReportError(kSelf, is_dump.error());
    std::string& slot = *is_dump ? dump_path : trace_path;
    if (!slot.empty()) {
      return UsageError(kSelf, fmt::format("{} and {}: two {}; give one dump and one trace", slot,
                                           in, *is_dump ? "dumps" : "traces"));
    }
    slot = in;
  }

  report::TimelineOptions opts;
  opts.from_ns = static_cast<uint64_t>(std::llround(from_s * 1e9));
  if (to_s >= 0) opts.to_ns = static_cast<uint64_t>(std::llround(to_s * 1e9));
  opts.min_duration_ns = static_cast<uint64_t>(std::llround(min_us * 1e3));
  opts.max_exits_per_vcpu = max_exits;

  // Read every input before the output is created: a bad input leaves no file behind.
  Result<Dump> dump = Fail(ErrorCode::kNotFound, "no dump");
  if (!dump_path.empty()) {
    dump = ReadDump(dump_path);
    if (!dump) return ReportError(kSelf, dump.error());
    DumpOtherData(*dump, dump_path, &opts);
    opts.vm = static_cast<uint32_t>(dump->process.pid);
    if (slow_only)
      opts.min_duration_ns = std::max(opts.min_duration_ns, dump->slow_exit_threshold_ns);
  } else if (slow_only) {
    return UsageError(kSelf, "--slow-only: needs a dump (its slow-exit threshold); use --min-us");
  }
  std::unique_ptr<sources::KvmInput> in;
  Result<analysis::JointView> view = Fail(ErrorCode::kNotFound, "no joint view");
  std::unique_ptr<sources::KvmDeviceMap> devices;
  if (!trace_path.empty()) {
    sources::KvmInputOptions iopts;
    if (dump) {
      view = analysis::BuildJointViewFromTrace(*dump, dump_path, trace_path);
      if (!view) return ReportError(kSelf, view.error());
      auto d = sources::KvmDeviceMap::LoadDump(dump_path);
      if (!d) return ReportError(kSelf, d.error());
      devices = std::move(*d);
      iopts.tsc_khz = dump->clock.tsc_hz ? (dump->clock.tsc_hz + 500) / 1000 : 1;
    }
    auto opened = sources::KvmInput::Open(trace_path, iopts);
    if (!opened) return ReportError(kSelf, opened.error());
    in = std::move(*opened);
    opts.other_data.push_back({"trace", trace_path});
    opts.other_data.push_back({"trace_format", in->format_name()});
    opts.other_data.push_back({"trace_clock", in->clock()});
  }

  std::FILE* out = out_path == "-" ? stdout : std::fopen(out_path.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "%s: %s: cannot create: %s\n", kSelf, out_path.c_str(),
                 std::strerror(errno));
    return 1;
  }
  report::TimelineWriter w(out, opts);

  if (dump && !in) {  // a dump alone
    w.SetBase(FirstTime(*dump));
    w.NameVm(opts.vm, VmName(*dump));
    sources::DumpSource src(*dump);
    src.Emit(&w);
    return Finish(w, dump->monotonic_ns, out_path, out);
  }

  if (!dump) {  // a trace alone: ts 0 is its first record
    struct First {
      report::TimelineWriter* w;
      sources::ClockScale scale;
      bool seen = false;
    } first{&w, in->scale()};
    sources::KvmPairer pairer({.clock = in->scale()}, w.kernel_sink());
    pairer.SetRecordObserver(
        [](const sources::KvmRecord& r, void* ctx) {
          auto* f = static_cast<First*>(ctx);
          if (f->seen) return;
          f->seen = true;
          f->w->SetBase(f->scale.ToNs(r.ts));
        },
        &first);
    if (Status s = in->ReadAll(&pairer); !s) {
      if (out != stdout) std::fclose(out);
      std::remove(out_path.c_str());
      return ReportError(kSelf, s.error());
    }
    return Finish(w, 0, out_path, out);
  }

  // The joint view: the trace's exits in the dump's ns on the dump's vCPU tracks.
  w.SetJointView(&*view);
  w.NameVm(opts.vm, VmName(*dump));
  JointKernelSink ksink(Clock::FromCalibration(dump->clock), *view, opts.vm, &w);
  sources::KvmPairer pairer({.devices = devices.get()}, &ksink);  // identity clock: ticks
  if (Status s = in->ReadAll(&pairer); !s) {
    if (out != stdout) std::fclose(out);
    std::remove(out_path.c_str());
    return ReportError(kSelf, s.error());
  }
  w.SetBase(std::min(FirstTime(*dump), ksink.first()));
  sources::DumpSource src(*dump);
  src.Emit(&w);
  return Finish(w, dump->monotonic_ns, out_path, out);
}

}  // namespace exitscope::cli
