// `exitscope inspect INPUT`: the exit-health report of a recorder dump (or kvm report's tables
// of a kernel trace), in any --format (report/renderer.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "cli/parse_args.h"
#include "cli/report_pipeline.h"
#include "exitscope/dump.h"
#include "fmt/format.h"
#include "report/renderer.h"
#include "sources/source.h"

namespace exitscope::cli {

int InspectMain(int argc, char** argv) {
  const char* self = "exitscope inspect";
  CLI::App app{
      "Summarise a recorder dump (.esdump): exits per kind, device, register and vCPU with\n"
      "count, total time, min, p50, p99, p99.9, max; the slow exits and watchdog findings in\n"
      "time order (with the I/Os in flight at each finding); lost-record counters. A kernel\n"
      "trace (.dat, trace-cmd report / ftrace / perf script text) gets `kvm report`'s tables.",
      argv[0]};
  std::string path, format = "table";
  int64_t vcpu = -1;
  std::string device;
  size_t rows = 20;
  bool all = false;
  bool events = false;
  app.add_option("INPUT", path,
                 "dump file written by the recorder (WriteDump, signal, exitscope run), or a "
                 "kernel trace; detected by content")
      ->required();
  app.add_option("--format", format, report::FormatChoices(report::Need::kFile))
      ->capture_default_str();
  std::string output;
  app.add_option("-o,--output", output,
                 "write the report to FILE ('-' or none: stdout); --format html and timeline "
                 "need it");
  app.add_option("--vcpu", vcpu, "only exits of this vCPU")->check(kNonNegativeInteger);
  app.add_option("--device", device, "only exits on this device (a name, or 'unassigned')");
  app.add_option("--rows", rows, "rows per table in table format (0 = all)")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  app.add_flag("--all", all, "list every row, slow exit and finding (implies --events)");
  app.add_flag("--events", events,
               "list the slow exits and watchdog findings one by one, with their I/Os in flight "
               "and stacks (by default each repeat is one line; JSON always lists each)");
  std::string kernel;
  app.add_option("--kernel", kernel,
                 "the joint view: match the dump's exits with a kernel trace of the same run "
                 "(x86-tsc clock, e.g. from `exitscope kvm record`) and split each exit's "
                 "time (docs/joint.md)");
  app.footer(
      "Exit status: 0 ok, 1 a runtime failure (e.g. a read error), 2 bad usage or a missing, "
      "corrupt or unsupported dump.\n"
      "JSON schema: docs/inspect.md. HTML (one self-contained page with plots): "
      "docs/html-report.md. Timeline: docs/timeline.md.");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  int status = 0;
  const report::Renderer* renderer =
      PickRenderer(self, format, report::Need::kFile, output, &status);
  if (renderer == nullptr) return status;

  auto src = sources::OpenSource(path, {});
  if (!src) return ReportError(self, src.error());
  const Dump* dump = (*src)->dump();
  if (dump == nullptr) {  // a kernel trace: kvm report's tables
    if (!kernel.empty() || !device.empty()) {
      return UsageError(self, fmt::format("{}: {}: a kernel trace, not a dump", path,
                                          !kernel.empty() ? "--kernel" : "--device"));
    }
    KvmReportRun run;
    run.self = self;
    run.renderer = renderer;
    run.output = output;
    run.analysis.vcpu = vcpu;
    run.vcpu = vcpu;
    return RenderKvmReport(run, **src);
  }
  if (!kernel.empty()) {
    if (vcpu >= 0 || !device.empty()) {
      return UsageError(self, "--kernel: --vcpu and --device do not apply");
    }
    return RenderJointReport(self, *renderer, *dump, path, kernel, all ? 0 : rows, output);
  }
  report::HealthModel h;
  h.dump = dump;
  report::ExitHealthOptions& o = h.options;
  o.source = path;
  o.max_rows = all ? 0 : rows;
  o.max_notable = all ? 0 : 50;
  o.events = events || all;
  o.events_command = fmt::format("exitscope inspect {} --events", path);
  if (vcpu >= 0) {
    if (static_cast<uint64_t>(vcpu) >= dump->vcpus.size()) {
      std::fprintf(stderr, "exitscope inspect: --vcpu %lld: the dump has %zu vCPUs (0..%zu)\n",
                   static_cast<long long>(vcpu), dump->vcpus.size(),
                   dump->vcpus.empty() ? 0 : dump->vcpus.size() - 1);
      return 2;
    }
    o.filter.vcpu = static_cast<uint32_t>(vcpu);
  }
  if (!device.empty()) {
    bool known = device == "unassigned";
    for (const DeviceInfo& d : dump->devices) known = known || d.name == device;
    if (!known) {
      std::string names;
      for (const DeviceInfo& d : dump->devices) names += (names.empty() ? "" : ", ") + d.name;
      std::fprintf(stderr, "exitscope inspect: --device %s: no such device in %s (devices: %s)\n",
                   device.c_str(), path.c_str(), names.empty() ? "none" : names.c_str());
      return 2;
    }
    o.filter.device = device;
  }
  report::ReportModel m{.health = &h};
  m.timeline.dump = dump;
  m.timeline.dump_path = path;
  try {
    if (Status s = report::WriteReport(*renderer, m, output); !s)
      return ReportError(self, s.error());
  } catch (const std::exception& e) {  // never an abort: one line naming the input
    std::fprintf(stderr, "exitscope inspect: %s: cannot render the report: %s\n", path.c_str(),
                 e.what());
    return 1;
  }
  return 0;
}

}  // namespace exitscope::cli
