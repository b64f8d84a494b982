// report/html_report_data.h: the HTML report's plots as data (html_report_model.h Plot):
// latency histograms from the rows' own buckets, the timeline and rate plots from an
// HtmlExitCollector's exits, and the joint view's split. Each plot's JSON is what
// web/report.js draws for its "kind"; nothing here writes markup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/exit_table.h"
#include "analysis/joint_view.h"
#include "report/html_report.h"
#include "report/html_report_model.h"

namespace exitscope::report::html {

// `v` rounded to a multiple of `unit` (keeps the data block short).
double Round(double v, double unit);

// The rows of `t`, in its order.
std::vector<const analysis::ExitRow*> RowsOf(const analysis::ExitTable& t);

// Kind "hist": one line per row for the first `series` rows with exits (most exits first),
// each row's LatencyHistogram buckets merged into 4 bins per octave. Its "left_out" counts
// the rows with exits that were not drawn.
nlohmann::json HistogramPlot(std::string id, std::string title,
                             std::vector<const analysis::ExitRow*> rows, size_t series);

struct Timeline {
  nlohmann::json chart;  // kind "timeline": the scatter per track
  nlohmann::json rate;   // kind "rate": exits per second per track, and the slow ones
  std::string note;      // "N of M exits drawn: ..."
};

// The scatter of `c`'s exits (every slow one up to max_slow_points, plus the longest and the
// shortest of each time bin of each track) and the rate per track. The slow exits are those
// the collector's SlowRule marked; `slow_rule` says in words what made an exit slow.
Timeline TimelinePlots(const HtmlExitCollector& c, const HtmlPlotOptions& o,
                       std::string_view slow_rule);

// Kind "split": each group's kernel time split into before / handler / after (and off-CPU
// when the trace recorded sched_switch) as shares of the group's summed kernel time, for
// the first `max_rows` groups; the note says how many were drawn when not all.
Plot JointSplitPlot(std::string id, std::string_view what,
                    const std::vector<analysis::JointGroup>& groups, bool sched, size_t max_rows);

}  // namespace exitscope::report::html
