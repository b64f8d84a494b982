// cli/report_pipeline.cc: the kvm analysis and the joint view of any source, rendered by the
// --format renderer.
#include "cli/report_pipeline.h"

#include <fmt/format.h>

#include <cstdio>
#include <vector>

#include "analysis/diagnosis.h"
#include "analysis/joint_view.h"
#include "cli/parse_args.h"
#include "report/format.h"
#include "report/html_report.h"

namespace exitscope::cli {
const report::Renderer* PickRenderer(const char* self, const std::string& format, report::Need need,
                                     const std::string& output, int* status) {
  auto r = report::FindRenderer(format, need);
  if (!r) {
    *status = UsageError(self, r.error().message);
    return nullptr;
  }
  if ((*r)->file && output.empty()) {
    *status =
        UsageError(self, fmt::format("--format {}: give the {} with -o FILE (-o - for stdout)",
                                     format, format == "html" ? "page's file" : "file"));
    return nullptr;
  }
  return *r;
}

report::DiagnosisTextOptions KvmDiagnosisText(const analysis::KvmAggregator& agg, bool dump) {
  report::DiagnosisTextOptions t;
  const uint64_t slow = agg.options().slow_ns;
  t.slow_rule = slow != 0 ? fmt::format("at least {}", report::FormatDuration(slow))
                          : fmt::format(
                                "at least {} (the diagnosis's default; --duration USEC "
                                "sets it and lists them)",
                                report::FormatDuration(analysis::kDiagnosisSlowNs));
  t.lost_meaning = dump ? "time inside exits as the VMM timed them, HLT apart (idle)"
                        : "the kernel's time of each exit, exit to guest entry, HLT apart (idle)";
  t.next_hint = slow != 0 ? "the slow exits one by one: --format json (slow_exits)" : "";
  return t;
}

int RenderKvmReport(KvmReportRun& run, sources::Source& src) {
  const std::string_view format = run.renderer->name;
  analysis::KvmAnalysisOptions aopts = run.analysis;
  if (aopts.slow_ns != 0) {
    // A line per slow exit as it is read; json lists the analysis's (KvmAnalysis::slow), html
    // marks them in the page's timeline.
    aopts.on_slow = [format](const ExitEvent& e, std::string_view k) {
      if (format == "table") {
        std::printf("%s\n", report::FormatKvmSlowExit(e, k).c_str());
      } else if (format == "csv") {
        std::fprintf(stderr, "%s\n", report::FormatKvmSlowExit(e, k).c_str());
      }
    };
  }
  const uint64_t slow_ns = aopts.slow_ns;
  analysis::KvmAggregator agg(std::move(aopts));
  // --format html: the page's timeline and rate plots draw the exits the aggregator counts.
  report::HtmlExitCollector exits(
      agg.slow_rule(), [&agg](const ExitEvent& e) { return agg.Counts(e); },
      /*group_targets=*/true);
  // The diagnosis counts the exits the tables count, under the tables' keys and slow rule.
  analysis::DiagnosisBuilder diag(analysis::KvmDiagnosisOptions(agg));
  TeeSink tee({&agg, &exits, &diag});
  TeeSink tee_text({&agg, &diag});
  const bool html = format == "html";
  if (format == "timeline") {
    // The timeline draws every exit of the source as it is replayed: no aggregation needed.
    // The source as opened (--tsc-mhz, --isa, --device-map), filtered as the analysis is.
    report::ReportModel m;
    if (const Dump* d = src.dump()) {
      m.timeline.dump = d;
      m.timeline.dump_path = src.info().name;
    } else {
      m.timeline.trace = &src;
    }
    m.timeline_options = run.timeline;
    m.timeline_options.only_vcpu = run.vcpu;
    m.timeline_options.only_pid = run.pid;
    if (Status s = report::WriteReport(*run.renderer, m, run.output); !s)
      return ReportError(run.self, s.error());
    return 0;
  }
  if (Status s = src.Run(html ? &tee : &tee_text); !s) return ReportError(run.self, s.error());
  agg.Finish();
  exits.Finish();

  const sources::SourceInfo& info = src.info();
  report::KvmModel k;
  k.analysis = &agg.analysis();
  k.context.input = info.name;
  k.context.format = info.format;
  k.context.clock = info.clock;
  k.context.tsc_khz = info.tsc_khz;
  k.context.tsc_khz_from_host = info.tsc_khz_from_host;
  k.context.lost_at_record = info.lost_at_record;
  k.context.pairing = src.pairing();  // null for a dump: its exits were never paired
  k.context.pid = run.pid;
  k.context.vcpu = run.vcpu;
  k.context.list_slow_exits = true;
  const analysis::Diagnosis diagnosis = diag.Finish();
  k.context.diagnosis = &diagnosis;
  k.context.diagnosis_text = KvmDiagnosisText(agg, src.dump() != nullptr);
  k.render = run.render;
  k.exits = &exits;
  k.slow_rule = slow_ns != 0
                    ? fmt::format("at least --duration {} us", static_cast<double>(slow_ns) / 1e3)
                    : "none marked: --duration USEC marks the exits at least that long";
  report::ReportModel m{.kvm = &k};
  std::fflush(stdout);  // the slow-exit lines printed while reading come before the report
  if (Status s = report::WriteReport(*run.renderer, m, run.output); !s)
    return ReportError(run.self, s.error());
  return 0;
}

Result<JointInputs> OpenJoint(const Dump& dump, const std::string& dump_path,
                              const std::string& trace_path, bool replay) {
  JointInputs j;
  auto devices = sources::KvmDeviceMap::LoadDump(dump_path);
  if (!devices) return Propagate(devices);
  j.devices = std::move(*devices);
  const sources::SourceOptions sopts = analysis::JointTraceOptions(dump, j.devices.get());
  auto trace = sources::OpenKernelTrace(trace_path, sopts);
  if (!trace) return Propagate(trace);
  auto vmm = sources::DumpAsSource(dump, dump_path);
  auto view = analysis::BuildJointView(*vmm, **trace);
  if (!view) return Propagate(view);
  j.view = std::move(*view);
  if (replay) {  // a source runs once: the timeline replays the trace from a second one
    auto again = sources::OpenKernelTrace(trace_path, sopts);
    if (!again) return Propagate(again);
    j.replay = std::move(*again);
  }
  return j;
}

int RenderJointReport(const char* self, const report::Renderer& r, const Dump& dump,
                      const std::string& dump_path, const std::string& trace_path, size_t rows,
                      const std::string& output) {
  auto in = OpenJoint(dump, dump_path, trace_path, r.name == std::string_view("timeline"));
  if (!in) return ReportError(self, in.error());
  report::JointModel j;
  j.dump = &dump;
  j.view = &in->view;
  j.options.dump = dump_path;
  j.options.trace = trace_path;
  j.options.rows = rows;
  j.options.slow_ns = dump.slow_exit_threshold_ns;
  report::ReportModel m{.joint = &j};
  m.timeline.dump = &dump;
  m.timeline.dump_path = dump_path;
  m.timeline.trace = in->replay.get();
  if (Status s = report::WriteReport(r, m, output); !s) return ReportError(self, s.error());
  return 0;
}

}  // namespace exitscope::cli
