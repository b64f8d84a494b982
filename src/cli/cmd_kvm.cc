// `exitscope kvm`: kernel-side exit analysis from KVM tracepoints.
//
//   exitscope kvm report -i FILE [--event vmexit|userspace|ioport|mmio|msr|hypercall]
//                        [--vcpu N] [-p PID] [-k sample|time|max|min|avg|p50|p99|p999]
//                        [--duration USEC] [--percentiles] [--per-vcpu] [--per-vm]
//                        [--histogram] [--format table|json|csv|html] [-o FILE]
//                        [--device-map FILE]
//                        [--pvm-numbering upstream|fork] [--isa auto|vmx|svm|pvm]
//                        [--tsc-mhz MHZ] [--dump DUMP]
//   exitscope kvm record ...   (cmd_kvm_record.cc)
//   exitscope kvm live ...     (cmd_kvm_live.cc)
//   exitscope kvm stat ...     (cmd_kvm_stat.cc)
//
// FILE is a trace-cmd .dat (as `exitscope kvm record` writes), `trace-cmd report` text, an
// ftrace `trace` file or `perf script` text; the format is detected from the content.
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
#include "exitscope/dump.h"
#include "fmt/format.h"
#include "report/html_report.h"
#include "report/joint_report.h"
#include "report/kvm_report.h"
#include "sources/kvm_device_map.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"

namespace exitscope::cli {
namespace {

constexpr size_t kMaxSlowExitsKept = 100000;  // JSON keeps the first ones; all are counted

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

// `kvm report --dump`: the joint view, as `inspect DUMP --kernel TRACE` prints it. Only
// --format table|json applies; --tsc-mhz is ignored (the dump's TSC calibration is used).
int JointMain(const char* self, const std::string& input, const std::string& dump_path,
              const std::string& format, bool tsc_mhz_given, const std::string& output) {
  if (format != "table" && format != "json" && format != "html") {
    return UsageError(self,
                      fmt::format("--dump: --format '{}' is not table, json or html", format));
  }
  if (format == "html" && !report::HtmlUnavailable().empty()) {
    std::fprintf(stderr, "%s: --format html: %s\n", self, report::HtmlUnavailable().data());
    return 1;
  }
  if (tsc_mhz_given) {
    std::fprintf(stderr,
                 "%s: --tsc-mhz ignored with --dump: the dump's TSC calibration converts the "
                 "trace's x86-tsc ticks\n",
                 self);
  }
  auto dump = ReadDump(dump_path);
  if (!dump) return ReportError(self, Error{dump.error().code, "--dump " + dump.error().message});
  report::JointRenderOptions jo;
  jo.dump = dump_path;
  jo.trace = input;
  auto out = format == "html" ? report::RenderJointHtml(*dump, jo)
                              : report::RenderJointViewOfFiles(*dump, jo, format == "json");
  if (!out) return ReportError(self, out.error());
  if (Status s = WriteOutput(output, *out); !s) return ReportError(self, s.error());
  return 0;
}

int ReportMain(int argc, char** argv) {
  const char* self = argv[0];
  CLI::App app{
      "Analyse KVM exits from a kvm trace, as perf kvm stat report does, with "
      "percentiles, histograms, device/register names and JSON/CSV output.",
      "exitscope kvm report"};
  std::string input, isa = "auto";
  double tsc_mhz = 0;
  KvmAnalysisFlags flags;
  app.add_option("-i,--input", input,
                 "trace file: trace-cmd .dat, trace-cmd report / ftrace text, perf script text")
      ->required();
  flags.Add(app, "only this VM (VMM process id) or vCPU thread id",
            "print each exit that took at least USEC microseconds (html: mark it slow)",
            "table | json | csv | html (one self-contained page with plots, docs/html-report.md)");
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
  if (flags.format == "html" && output.empty()) {
    return UsageError(self, "--format html: give the page's file with -o FILE (-o - for stdout)");
  }
  if (!dump_path.empty())
    return JointMain(self, input, dump_path, flags.format, tsc_mhz > 0, output);

  analysis::KvmAnalysisOptions aopts;
  report::KvmRenderOptions ropts;
  sources::KvmPairerOptions popts;
  std::unique_ptr<sources::KvmDeviceMap> devices;
  if (int rc = flags.Apply(self, &aopts, &ropts, &popts, &devices); rc != 0) return rc;
  const std::string& format = flags.format;
  if (format == "html" && !report::HtmlUnavailable().empty()) {
    std::fprintf(stderr, "%s: --format html: %s\n", self, report::HtmlUnavailable().data());
    return 1;
  }
  sources::KvmInputOptions iopts;
  if (isa == "auto")
    iopts.text.isa = Isa::kUnknown;
  else if (isa == "vmx")
    iopts.text.isa = Isa::kVmx;
  else if (isa == "svm")
    iopts.text.isa = Isa::kSvm;
  else if (isa == "pvm")
    iopts.text.isa = Isa::kPvm;
  else
    return UsageError(self, fmt::format("--isa: '{}' is not auto, vmx, svm or pvm", isa));
  iopts.tsc_khz = static_cast<uint64_t>(tsc_mhz * 1000.0 + 0.5);

  auto in = sources::KvmInput::Open(input, iopts);
  if (!in) return ReportError(self, in.error());
  popts.clock = (*in)->scale();

  std::vector<report::KvmSlowExit> slow;
  if (aopts.slow_ns != 0) {
    aopts.on_slow = [&](const ExitEvent& e, std::string_view k) {
      if (format == "table") {
        std::printf("%s\n", report::FormatKvmSlowExit(e, k).c_str());
      } else if (format == "csv") {
        std::fprintf(stderr, "%s\n", report::FormatKvmSlowExit(e, k).c_str());
      } else if (format == "html") {
        // marked in the page's timeline (the collector's threshold)
      } else if (slow.size() < kMaxSlowExitsKept) {
        slow.push_back({e.start_ns, e.duration_ns, e.vm, e.vcpu, e.tid, std::string(e.reason),
                        std::string(k), std::string(e.device), std::string(e.reg)});
      }
    };
  }
  // --format html: the page's timeline and rate plots draw the exits the aggregator counts.
  const uint64_t slow_ns = aopts.slow_ns;
  analysis::KvmAggregator agg(std::move(aopts));
  report::HtmlExitCollector exits(
      [slow_ns](const ExitEvent& e) { return slow_ns != 0 && e.duration_ns >= slow_ns; },
      [&agg](const ExitEvent& e) { return agg.Counts(e); }, /*group_targets=*/true);
  TeeSink tee({&agg, &exits});
  sources::KvmPairer pairer(popts, format == "html" ? static_cast<EventSink*>(&tee) : &agg);
  if (Status s = (*in)->ReadAll(&pairer); !s) return ReportError(self, s.error());
  agg.Finish();
  exits.Finish();

  report::KvmReportContext ctx;
  ctx.input = input;
  ctx.format = (*in)->format_name();
  ctx.clock = (*in)->clock();
  ctx.tsc_khz = (*in)->tsc_khz();
  ctx.tsc_khz_from_host = (*in)->tsc_khz_from_host();
  ctx.lost_at_record = (*in)->lost_at_record();
  ctx.pairing = &pairer.stats();
  ctx.pid = flags.pid;
  ctx.vcpu = flags.vcpu;
  ctx.slow_exits = &slow;
  std::string out;
  if (format == "html")
    out = report::RenderKvmHtml(
        agg.analysis(), ctx, ropts, exits,
        slow_ns != 0 ? fmt::format("at least --duration {} us", slow_ns / 1e3)
                     : "none marked: --duration USEC marks the exits at least that long");
  else if (format == "json")
    out = report::RenderKvmJson(agg.analysis(), ctx, ropts);
  else if (format == "csv")
    out = report::RenderKvmCsv(agg.analysis(), ctx, ropts);
  else
    out = report::RenderKvmTable(agg.analysis(), ctx, ropts);
  if (Status s = WriteOutput(output, out); !s) return ReportError(self, s.error());
  return 0;
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
