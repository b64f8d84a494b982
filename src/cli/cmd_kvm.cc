// `exitscope kvm`: kernel-side exit analysis from KVM tracepoints.
//
//   exitscope kvm report -i FILE [--event vmexit|userspace|ioport|mmio|msr|hypercall]
//                        [--vcpu N] [-p PID] [-k sample|time|max|min|avg|p50|p99|p999]
//                        [--duration USEC] [--percentiles] [--per-vcpu] [--per-vm]
//                        [--histogram] [--format table|json|csv|html|timeline] [-o FILE]
//                        [--device-map FILE]
//                        [--pvm-numbering upstream|fork] [--isa auto|vmx|svm|pvm]
//                        [--tsc-mhz MHZ] [--dump DUMP]
//   exitscope kvm record ...   (cmd_kvm_record.cc)
//   exitscope kvm live ...     (cmd_kvm_live.cc)
//   exitscope kvm stat ...     (cmd_kvm_stat.cc)
//
// FILE is a trace-cmd .dat (as `exitscope kvm record` writes), `trace-cmd report` text, an
// ftrace `trace` file, `perf script` text or a recorder dump; the format is detected from the
// content (sources::OpenSource).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "analysis/kvm_stats.h"
#include "cli/commands.h"
#include "cli/kvm_flags.h"
#include "cli/parse_args.h"
#include "cli/report_pipeline.h"
#include "exitscope/dump.h"
#include "fmt/format.h"
#include "report/renderer.h"
#include "sources/kvm_device_map.h"
#include "sources/source.h"

namespace exitscope::cli {
namespace {

void KvmUsage(FILE* out) {
  std::fprintf(out,
               "usage: exitscope kvm <report|record|live|stat> [options]\n\n"
               "  report  analyse a kvm trace file (-i FILE: trace-cmd .dat, trace-cmd report /\n"
               "          ftrace text, perf script text) as perf kvm stat does, and more\n"
               "  record  record kvm tracepoints from tracefs into a .dat file\n"
               "  live    show the analysis live, refreshed every -d SECS\n"
               "  stat    --bpf: the analysis aggregated in the kernel by eBPF\n\n"
               "`exitscope kvm <command> --help` lists each command's options.\n");
}

int ReportMain(int argc, char** argv) {
  const char* self = argv[0];
  CLI::App app{
      "Analyse KVM exits from a kvm trace, as perf kvm stat report does, with "
      "percentiles, histograms, device/register names and JSON/CSV output. A recorder dump "
      "is read too: its exits, as the VMM saw them, in the same tables.",
      "exitscope kvm report"};
  std::string input, isa = "auto";
  double tsc_mhz = 0;
  KvmAnalysisFlags flags;
  app.add_option("-i,--input", input,
                 "trace file: trace-cmd .dat, trace-cmd report / ftrace text, perf script text; "
                 "or a recorder dump (.esdump)")
      ->required();
  flags.Add(app, "only this VM (VMM process id) or vCPU thread id",
            "print each exit that took at least USEC microseconds (html: mark it slow)",
            "table | json | csv | html (one self-contained page with plots, docs/html-report.md) "
            "| timeline (Trace Event JSON, docs/timeline.md)");
  flags.html_format = true;
  std::string output;
  app.add_option("-o,--output", output, "write the report to FILE ('-' or none: stdout)");
  app.add_option("--isa", isa,
                 "text traces only: which table kvm_exit reasons use: auto | vmx | svm | pvm");
  app.add_option("--tsc-mhz", tsc_mhz,
                 "TSC frequency of the capture host, for x86-tsc timestamps (default: this "
                 "host's; 1..100000)")
      ->check(NumberIn(1, 100'000, "MHz"));
  std::string dump_path;
  app.add_option("--dump", dump_path,
                 "the joint view: match the trace's userspace exits with a recorder dump of the "
                 "same run and split each exit's time (docs/joint.md); x86-tsc ticks are "
                 "converted with the dump's TSC calibration");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  int status = 0;
  const report::Renderer* renderer =
      PickRenderer(self, flags.format, report::Need::kFile, output, &status);
  if (renderer == nullptr) return status;
  if (!dump_path.empty()) {
    if (tsc_mhz > 0) {
      std::fprintf(stderr,
                   "%s: --tsc-mhz ignored with --dump: the dump's TSC calibration converts the "
                   "trace's x86-tsc ticks\n",
                   self);
    }
    auto dump = ReadDump(dump_path);
    if (!dump) return ReportError(self, Error{dump.error().code, "--dump " + dump.error().message});
    return RenderJointReport(self, *renderer, *dump, dump_path, input, 20, output);
  }

  KvmReportRun run;
  run.self = self;
  run.renderer = renderer;
  run.output = output;
  sources::SourceOptions sopts;
  std::unique_ptr<sources::KvmDeviceMap> devices;
  if (int rc = flags.Apply(self, &run.analysis, &run.render, &sopts.pairer, &devices); rc != 0)
    return rc;
  if (isa == "auto")
    sopts.input.text.isa = Isa::kUnknown;
  else if (isa == "vmx")
    sopts.input.text.isa = Isa::kVmx;
  else if (isa == "svm")
    sopts.input.text.isa = Isa::kSvm;
  else if (isa == "pvm")
    sopts.input.text.isa = Isa::kPvm;
  else
    return UsageError(self, fmt::format("--isa: '{}' is not auto, vmx, svm or pvm", isa));
  sopts.input.tsc_khz = static_cast<uint64_t>(tsc_mhz * 1000.0 + 0.5);
  run.pid = flags.pid;
  run.vcpu = flags.vcpu;
  auto src = sources::OpenSource(input, sopts);
  if (!src) return ReportError(self, src.error());
  return RenderKvmReport(run, **src);
}

}  // namespace

int KvmMain(int argc, char** argv) {
  const char* self = argc > 0 ? argv[0] : "exitscope kvm";
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help") ||
      !std::strcmp(argv[1], "help")) {
    KvmUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string sub = argv[1];
  int (*fn)(int, char**) = nullptr;
  if (sub == "report")
    fn = ReportMain;
  else if (sub == "record")
    fn = KvmRecordMain;
  else if (sub == "live")
    fn = KvmLiveMain;
  else if (sub == "stat")
    fn = KvmStatMain;
  if (fn == nullptr) {
    std::fprintf(stderr, "%s: unknown command '%s' (report, record, live, stat)\n", self,
                 sub.c_str());
    return 2;
  }
  std::string name = std::string(self) + " " + sub;
  std::vector<char*> args;
  args.push_back(name.data());
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  return fn(static_cast<int>(args.size()), args.data());
}

}  // namespace exitscope::cli
