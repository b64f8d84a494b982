// report/renderer.h: the output formats, each registered once (renderer.cc), the same names
// for every command. A command opens its sources (sources/source.h), analyses them
// (analysis/) and hands the result, a ReportModel, to the renderer --format names:
//
//   auto r = report::FindRenderer(format, report::Need::kFile);   // one line naming the choices
//   if (!r) return ReportError(self, r.error());
//   report::ReportModel m{.health = &health};
//   Status s = report::WriteReport(**r, m, output);               // -o PATH, "-": stdout
//
//   table     the text report (docs/inspect.md, docs/kvm.md, docs/joint.md)
//   json      the same as one JSON document (docs/json.md)
//   csv       the rows, one line each (docs/json.md "CSV")
//   html      one self-contained page with plots (docs/html-report.md); needs -o
//   timeline  Trace Event JSON for ui.perfetto.dev (docs/timeline.md); needs -o; not live
//
// A live command (kvm live, kvm stat) renders one refresh at a time as text (RenderText) with
// the formats whose `live` is set; its Prometheus endpoint (--metrics) is its live renderer
// for scrapers.
//
// Adding a format: one file render_<name>.cc defining a `const Renderer` that handles the
// three models, and its line in renderer.cc's table.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "analysis/joint_view.h"
#include "analysis/kvm_stats.h"
#include "exitscope/dump.h"
#include "exitscope/status.h"
#include "report/exit_health.h"
#include "report/joint_report.h"
#include "report/kvm_report.h"
#include "report/timeline.h"

namespace exitscope::report {

class HtmlExitCollector;

// A recorder dump or live snapshot: `exitscope inspect`, `exitscope run`.
struct HealthModel {
  const Dump* dump = nullptr;
  ExitHealthOptions options{};  // options.format is the renderer's
};

// A kernel trace, a live stream or the eBPF maps: `exitscope kvm report|live|stat`.
struct KvmModel {
  const analysis::KvmAnalysis* analysis = nullptr;
  KvmReportContext context{};
  KvmRenderOptions render{};
  const HtmlExitCollector* exits = nullptr;  // html: the exits the source produced (else null)
  std::string slow_rule{};                   // html: what made an exit slow, in words
};

// The joint view of a dump and a trace of the same run (`inspect --kernel`, `kvm report
// --dump`).
struct JointModel {
  const Dump* dump = nullptr;
  const analysis::JointView* view = nullptr;
  JointRenderOptions options{};
};

// What a renderer draws: exactly one of the three models, plus what the timeline needs to
// replay the inputs (files by path, or the dump in memory).
struct ReportModel {
  const HealthModel* health = nullptr;
  const KvmModel* kvm = nullptr;
  const JointModel* joint = nullptr;
  TimelineInputs timeline{};
  TimelineOptions timeline_options{};
};

struct Renderer {
  std::string_view name;
  std::string_view help;  // one phrase for --help
  bool live = false;      // renders a refresh of a live command (as text)
  bool file = false;      // a document for a browser or a viewer: needs -o FILE (- is stdout)
  // The report as text (null for a format written as a stream).
  Result<std::string> (*text)(const ReportModel& m) = nullptr;
  // Writes the report to `path` by the one output rule ("" or "-": stdout); null when text.
  Status (*write)(const ReportModel& m, const std::string& path) = nullptr;
};

// Every format, in the order --help lists them.
std::span<const Renderer* const> Renderers();

enum class Need { kFile, kLive };
// The format `name`; for a live command only the live ones. kInvalidArgument with one line
// "--format 'x': not one of table, json, csv, html, timeline" (the choices of `need`).
Result<const Renderer*> FindRenderer(std::string_view name, Need need);
// "table | json | csv | html | timeline": the --format help of a command.
std::string FormatChoices(Need need);

// Renders `m` with `r` to `path` (text formats through the one output rule; errors name
// "-o PATH", or "standard output").
Status WriteReport(const Renderer& r, const ReportModel& m, const std::string& path);
// A live refresh as text (r.live).
Result<std::string> RenderText(const Renderer& r, const ReportModel& m);

// The renderers (render_*.cc), registered in renderer.cc.
extern const Renderer kTableRenderer;
extern const Renderer kJsonRenderer;
extern const Renderer kCsvRenderer;
extern const Renderer kHtmlRenderer;
extern const Renderer kTimelineRenderer;

}  // namespace exitscope::report
