// `exitscope timeline INPUT... -o OUT`: the exit timeline of a recorder dump, a kernel trace or
// both (the joint view) as Trace Event JSON for ui.perfetto.dev / chrome://tracing
// (docs/timeline.md). Every input goes through the one event stream into
// report::TimelineWriter: sources::DumpSource for a dump, KvmInput -> KvmPairer for a trace.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "analysis/joint_view.h"
#include "cli/commands.h"
#include "cli/parse_args.h"
#include "cli/report_pipeline.h"
#include "exitscope/clock.h"
#include "exitscope/dump.h"
#include "report/timeline.h"
#include "sources/dump_source.h"
#include "sources/input_format.h"
#include "sources/kvm_device_map.h"
#include "sources/source.h"

namespace exitscope::cli {
namespace {

constexpr const char* kSelf = "exitscope timeline";
// Whether `path` is a recorder dump (sources/input_format.h); the error names the file.
Result<bool> IsDump(const std::string& path) {
  auto format = sources::SniffInputFile(path);
  if (!format) return Propagate(format);
  return *format == sources::InputFormat::kDump;
}

int Summary(const report::TimelineStats& st, const std::string& out_path) {
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
  app.add_option("--from", from_s,
                 "only from this many seconds after the timeline's start (0..31536000)")
      ->check(NumberIn(0, 31'536'000, "s"));
  app.add_option("--to", to_s,
                 "only until this many seconds after the timeline's start (0..31536000)")
      ->check(NumberIn(0, 31'536'000, "s"));
  app.add_option("--min-us", min_us,
                 "only exits at least this many microseconds long (0..3600000000)")
      ->check(NumberIn(0, 3'600'000'000.0, "us"));
  app.add_flag("--slow-only", slow_only,
               "only the exits at or above the dump's slow-exit threshold");
  app.add_option("--max-exits", max_exits,
                 "at most this many exit slices (0 = all): the first in time order, each vCPU "
                 "of a dump its share; keeps the file loadable (docs/timeline.md)")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  std::string device_map;
  app.add_option("--device-map", device_map,
                 "a trace alone: name ports and MMIO addresses by this device map (a dump or a "
                 "text map, as kvm report --device-map)");
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
  opts.max_exits = max_exits;

  Result<Dump> dump = Fail(ErrorCode::kNotFound, "no dump");
  if (!dump_path.empty()) {
    dump = ReadDump(dump_path);
    if (!dump) return ReportError(kSelf, dump.error());
    if (slow_only)
      opts.min_duration_ns = std::max(opts.min_duration_ns, dump->slow_exit_threshold_ns);
  } else if (slow_only) {
    return UsageError(kSelf, "--slow-only: needs a dump (its slow-exit threshold); use --min-us");
  }
  if (!device_map.empty() && (dump_path.empty() == trace_path.empty())) {
    return UsageError(kSelf, "--device-map: only with a trace alone (a dump names its own)");
  }
  // Open the sources, build the analysis (the joint view), then replay into the renderer.
  report::TimelineInputs tin;
  tin.dump = dump ? &*dump : nullptr;
  tin.dump_path = dump_path;
  Result<JointInputs> joint = Fail(ErrorCode::kNotFound, "no joint view");
  std::unique_ptr<sources::KvmDeviceMap> devices;
  std::unique_ptr<sources::Source> trace;
  if (dump && !trace_path.empty()) {
    joint = OpenJoint(*dump, dump_path, trace_path, /*replay=*/true);
    if (!joint) return ReportError(kSelf, joint.error());
    tin.joint = &joint->view;
    tin.trace = joint->replay.get();
  } else if (!trace_path.empty()) {
    sources::SourceOptions sopts;
    if (!device_map.empty()) {
      auto d = sources::KvmDeviceMap::Load(device_map);
      if (!d) return ReportError(kSelf, d.error());
      devices = std::move(*d);
      sopts.pairer.devices = devices.get();
    }
    auto t = sources::OpenKernelTrace(trace_path, sopts);
    if (!t) return ReportError(kSelf, t.error());
    trace = std::move(*t);
    tin.trace = trace.get();
  }
  auto stats = report::WriteTimeline(tin, opts, out_path);
  if (!stats) return ReportError(kSelf, stats.error());
  return Summary(*stats, out_path);
}

}  // namespace exitscope::cli
