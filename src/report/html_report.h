// report/html_report.h: the HTML report (docs/html-report.md): one self-contained page that
// opens offline, with plots drawn by the plotting library embedded at build time
// (html_assets.h: Apache ECharts, inlined with its licence) and the text report's tables as
// HTML tables.
//
//   exitscope inspect DUMP --format html -o report.html           RenderExitHealthHtml
//   exitscope inspect DUMP --kernel TRACE --format html -o F      RenderJointHtml
//   exitscope kvm report -i TRACE --format html -o F              RenderKvmHtml
//
// The page holds: latency histograms per row of each breakdown (kind / reason, device,
// register) from the rows' own LatencyHistogram buckets, merged into 4 bins per octave, on
// log axes; a per-vCPU timeline of exits (start time vs duration, log y) with the slow ones
// marked; the exit rate over time per vCPU; for the joint view, the split of each exit's
// kernel time (before / handler / after / off-CPU) as stacked bars per kind, device and
// register; then the tables. Everything comes from the same rows and event stream the text
// and JSON reports use: the page only draws them.
//
// Size is bounded whatever the input: the timeline draws every slow exit (up to
// HtmlPlotOptions::max_slow_points) plus, of the others, the longest and the shortest exit
// of each of a bounded number of time bins per vCPU; the page says how many it drew of how
// many. Rate bins, histogram series and table rows are bounded too.
//
// Inside, data shaping and the page meet at a plain model (html_report_model.h):
// html_report.cc and html_report_data.cc decide what each page shows, html_report_page.cc
// writes the document with the page's style and script (web/report.css, web/report.js).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "analysis/exit_table.h"
#include "analysis/kept_event.h"
#include "analysis/kvm_stats.h"
#include "exitscope/dump.h"
#include "exitscope/status.h"
#include "report/exit_health.h"
#include "report/joint_report.h"
#include "report/kvm_report.h"
#include "sources/event.h"

namespace exitscope::report {

struct HtmlPlotOptions {
  size_t max_points = 20000;       // exits drawn in the timeline besides the slow ones
  size_t max_slow_points = 20000;  // slow exits drawn (the rest are counted)
  size_t rate_bins = 200;          // time bins of the exit-rate plot
  size_t histogram_series = 10;    // rows drawn per histogram plot (most exits first)
  size_t table_rows = 500;         // rows per HTML table (the rest are counted)
};

// Keeps what the timeline and rate plots need from an exit stream: per exit with a known
// time (ExitEnd::kSeen, not a kernel access), its start, duration, track (vCPU, or VM and
// vCPU when the stream has several VMs), label (reason and device.register) and whether it
// is slow (the analysis's SlowRule). 24 bytes an exit.
class HtmlExitCollector final : public EventSink {
 public:
  // `slow` says which exits are slow (the analysis's rule: the recorder's flags for a dump,
  // KvmAggregator::slow_rule() for kvm report; default: none); `pass` whether an exit is in
  // the report at all (the report's --vcpu / --device / -p filters; empty: all pass).
  // `group_targets`: also count the exits that pass into rows by device and by register
  // (exit_table.h ExitKey::kDevice / kRegister), for a report whose own rows are not (a kvm
  // report's rows are its event class's keys).
  HtmlExitCollector(analysis::SlowRule slow, std::function<bool(const ExitEvent&)> pass,
                    bool group_targets = false);
  void OnExit(const ExitEvent& e) override;

  struct Point {
    uint64_t start_ns;
    uint64_t duration_ns;
    uint32_t track;
    uint32_t label : 31;
    uint32_t slow : 1;
  };
  const std::vector<Point>& points() const noexcept { return points_; }
  const std::vector<std::string>& labels() const noexcept { return labels_; }
  // Track names in track order: "vCPU 0", or "VM 4242 vCPU 0" when there are several VMs.
  std::vector<std::string> TrackNames() const;
  size_t tracks() const noexcept { return tracks_.size(); }
  // With group_targets: the rows by device and by register, sorted by total time.
  const analysis::ExitTable& by_device() const noexcept { return by_device_; }
  const analysis::ExitTable& by_register() const noexcept { return by_register_; }
  void Finish();

 private:
  analysis::SlowRule slow_;
  std::function<bool(const ExitEvent&)> pass_;
  std::vector<Point> points_;
  std::vector<std::string> labels_;
  std::unordered_map<std::string, uint32_t> label_index_;
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> tracks_;  // (vm, vcpu) -> track
  std::string scratch_;
  analysis::ExitTable by_device_, by_register_;
  std::unique_ptr<analysis::ExitGrouper> devices_, registers_;  // with group_targets
};

// Empty when this build can write HTML; else the one line saying why not (the plotting
// library was not installed when it was built: html_assets.h).
std::string_view HtmlUnavailable();

// `inspect DUMP --format html`: the exit-health report's content (options.filter applies;
// the tables list every row up to HtmlPlotOptions::table_rows).
std::string RenderExitHealthHtml(const Dump& dump, const ExitHealthOptions& options,
                                 const HtmlPlotOptions& plot = {});

// `inspect DUMP --kernel TRACE --format html`: the dump's exit-health page plus the joint
// view's split as stacked bars and its tables.
std::string RenderJointHtml(const Dump& dump, const analysis::JointView& view,
                            const JointRenderOptions& o, const HtmlPlotOptions& plot = {});

// `kvm report --format html`: `exits` is the collector the pairer's events were teed into
// beside the aggregator; `slow_rule` says in words what made an exit slow there. `kvm stat
// --bpf --stacks`: no exits one by one (null: no timeline plot), ctx.offcpu's slow exits seen
// from the kernel as a section.
std::string RenderKvmHtml(const analysis::KvmAnalysis& a, const KvmReportContext& ctx,
                          const KvmRenderOptions& opts, const HtmlExitCollector* exits,
                          std::string_view slow_rule, const HtmlPlotOptions& plot = {});

}  // namespace exitscope::report
