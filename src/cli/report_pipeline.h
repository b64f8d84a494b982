// cli/report_pipeline.h: "open sources -> analysis -> renderer", the part every reporting
// command shares: the kvm analysis of any source (a kernel trace, or a dump's exits), and the
// joint view of a dump and a trace, rendered by the --format renderer (report/renderer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "analysis/diagnosis.h"
#include "analysis/joint_view.h"
#include "analysis/kvm_stats.h"
#include "exitscope/dump.h"
#include "report/kvm_report.h"
#include "report/renderer.h"
#include "sources/source.h"

namespace exitscope::cli {

struct KvmReportRun {
  const char* self = "";
  const report::Renderer* renderer = nullptr;
  std::string output;  // -o
  analysis::KvmAnalysisOptions analysis{};
  report::KvmRenderOptions render{};
  int64_t pid = -1, vcpu = -1;
  report::TimelineOptions timeline{};
};

// The format --format names, for a command that writes a file (every format) or refreshes
// live; and its -o: a file format (html, timeline) needs one. Returns the renderer, or prints
// one line and sets *status (2).
const report::Renderer* PickRenderer(const char* self, const std::string& format, report::Need need,
                                     const std::string& output, int* status);

// The words of a kvm analysis's diagnosis (analysis::KvmDiagnosisOptions groups it; `dump`:
// the source is a recorder dump).
report::DiagnosisTextOptions KvmDiagnosisText(const analysis::KvmAggregator& agg, bool dump);

// Runs `src` into the kvm analysis and renders it. Slow exits (analysis.slow_ns) are printed
// as they come in table format (stderr in csv), kept for json, marked in html. Returns the
// process exit status.
int RenderKvmReport(KvmReportRun& run, sources::Source& src);

// The joint view of `dump` (read from dump_path) and the kernel trace `trace_path`: the trace
// opened with analysis::JointTraceOptions and both sources run into the joint view; with
// `replay`, the trace opened again (not yet run) for a renderer that replays it (timeline).
struct JointInputs {
  std::unique_ptr<sources::KvmDeviceMap> devices;  // the dump's, used by both trace sources
  analysis::JointView view;
  std::unique_ptr<sources::Source> replay;  // null without `replay`
};
Result<JointInputs> OpenJoint(const Dump& dump, const std::string& dump_path,
                              const std::string& trace_path, bool replay);

// Builds the joint view of `dump` (read from dump_path) and the kernel trace `trace_path` and
// renders it. Returns the process exit status.
int RenderJointReport(const char* self, const report::Renderer& r, const Dump& dump,
                      const std::string& dump_path, const std::string& trace_path, size_t rows,
                      const std::string& output);

}  // namespace exitscope::cli
