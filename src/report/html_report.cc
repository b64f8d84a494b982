// The HTML report's pages as data (html_report_model.h): what each of the three pages
// shows, from the rows and the event stream the text and JSON reports use. The plots' data
// is html_report_data.cc's; html_report_page.cc writes the document.
#include "report/html_report.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "analysis/exit_summary.h"
#include "base/histogram.h"
#include "report/format.h"
#include "report/html_assets.h"
#include "report/html_report_data.h"
#include "report/html_report_model.h"
#include "report/offcpu_report.h"

namespace exitscope::report {
namespace {

using analysis::ExitTable;
using base::LatencyStats;
using html::Details;
using html::Heading;
using html::Note;
using html::Plot;
using html::Section;
using html::Table;

constexpr const char* kHistogramNote =
    "From each row's own histogram (the buckets the analysis keeps), merged into 4 bins per "
    "octave: both axes are log scales. Empty bins are gaps.";

std::string PercentText(uint64_t part, uint64_t whole) {
  return whole ? fmt::format("{:.2f}%", 100.0 * static_cast<double>(part) / whole) : "-";
}

// A table's columns: Key for names (left-aligned), Col for figures (right-aligned), and
// Cols for several figures.
Table::Column Key(std::string name) {
  return {std::move(name), true};
}
Table::Column Col(std::string name) {
  return {std::move(name), false};
}
void Cols(Table& t, std::initializer_list<const char*> names) {
  for (const char* n : names) t.columns.push_back(Col(n));
}

// A breakdown of the exit-health report as the text report's columns.
void HealthTable(Section& out, std::string_view heading, std::string_view key, const ExitTable& t,
                 double span_s, size_t max_rows) {
  if (t.rows.empty()) return;
  out.blocks.push_back(Heading{std::string(heading)});
  Table tab;
  tab.columns = {Key(std::string(key))};
  Cols(tab, {"count", "rate/s", "total", "min", "p50", "p99", "p99.9", "max"});
  size_t n = 0;
  for (const auto& r : t.rows) {
    if (n++ == max_rows) break;
    const LatencyStats& s = r->stats;
    tab.rows.push_back({r->key, fmt::format("{}", s.count()),
                        span_s > 0 ? fmt::format("{:.1f}", s.count() / span_s) : "-",
                        FormatDurationNs(s.sum()), FormatDurationNs(s.min()),
                        FormatDurationNs(s.Quantile(0.5)), FormatDurationNs(s.Quantile(0.99)),
                        FormatDurationNs(s.Quantile(0.999)), FormatDurationNs(s.max())});
  }
  out.blocks.push_back(std::move(tab));
  if (t.rows.size() > max_rows)
    out.blocks.push_back(
        Note{fmt::format("{} more rows (--format json lists all)", t.rows.size() - max_rows)});
}

// The diagnosis, first on every page: the answer, the vCPUs' losses, the causes ranked with
// their evidence, and links to the plots and tables that show it.
Section DiagnosisSection(const analysis::Diagnosis& d, const DiagnosisTextOptions& o,
                         bool has_timeline) {
  Section sec{"diagnosis", "Diagnosis", {}};
  sec.blocks.push_back(Note{DiagnosisHeadline(d, o), !d.all_well()});
  if (!o.seen_from_kernel.empty())
    sec.blocks.push_back(Note{o.seen_from_kernel, false, "#s-kernel-slow-exits"});
  if (d.exits == 0) return sec;
  const auto pct = [&](double share) {
    return d.span_ns ? fmt::format("{:.1f} %", share * 100.0) : std::string("-");
  };
  bool off_cpu = false;
  for (const analysis::DiagnosisVcpu& x : d.vcpus) off_cpu = off_cpu || x.off_cpu_ns != 0;
  Table v;
  if (off_cpu)
    Cols(v, {"vCPU", "lost", "share of the run", "in slow or stuck exits", "idle (HLT)",
             "off the CPU"});
  else
    Cols(v, {"vCPU", "lost", "share of the run", "in slow or stuck exits", "idle (HLT)"});
  v.columns[0].key = true;
  for (const analysis::DiagnosisVcpu& x : d.vcpus) {
    v.rows.push_back({fmt::format("{}", x.vcpu), FormatDurationNs(x.lost_ns), pct(x.share),
                      FormatDurationNs(x.slow_ns), FormatDurationNs(x.idle_ns)});
    if (off_cpu) v.rows.back().push_back(FormatDurationNs(x.off_cpu_ns));
  }
  sec.blocks.push_back(Heading{"What each vCPU lost"});
  if (!o.lost_meaning.empty()) sec.blocks.push_back(Note{"lost: " + o.lost_meaning});
  sec.blocks.push_back(std::move(v));
  Table c;
  Cols(c, {"#", "cause", "exits", "lost", "share of the run", "typical", "worst", "vCPUs"});
  c.columns[1].key = true;
  std::vector<Note> evidence;
  bool stacks = false;
  size_t n = 0;
  for (const analysis::DiagnosisGroup& g : d.groups) {
    if (n == o.max_groups || (n > 0 && !g.slow && !g.open && g.share < 0.01)) break;
    ++n;
    const std::string cause = g.cause + (g.open ? " (still inside)" : g.slow ? " (slow)" : "");
    for (const analysis::DiagnosisEvidence& e : g.evidence) {
      evidence.push_back(Note{fmt::format("{}. {}: {}", n, cause, EvidenceText(e, g.count))});
      stacks = stacks || e.kind == "stack";
    }
    std::string vcpus;
    for (uint32_t x : g.vcpus) vcpus += fmt::format("{}{}", vcpus.empty() ? "" : ",", x);
    c.rows.push_back({fmt::format("{}", n), cause, fmt::format("{}", g.count),
                      FormatDurationNs(g.lost_ns), pct(g.share), FormatDurationNs(g.typical_ns),
                      FormatDurationNs(g.worst_ns), vcpus});
  }
  if (!c.rows.empty()) {
    sec.blocks.push_back(Heading{"What took the time, largest first"});
    if (!o.slow_rule.empty()) sec.blocks.push_back(Note{"slow: " + o.slow_rule});
    sec.blocks.push_back(std::move(c));
  }
  if (!evidence.empty()) sec.blocks.push_back(Heading{"The evidence"});
  for (Note& e : evidence) sec.blocks.push_back(std::move(e));
  sec.blocks.push_back(Note{"See: each exit's duration, by cause", false, "#s-histograms"});
  if (has_timeline)
    sec.blocks.push_back(Note{"See: the slow exits over time", false, "#s-timeline"});
  if (stacks)
    sec.blocks.push_back(
        Note{"See: the stuck threads' stacks (watchdog findings)", false, "#s-tables"});
  return sec;
}

// The dump's header, plots and tables (inspect's page, and the second half of the joint one).
void DumpSections(html::Page& p, const Dump& d, const ExitHealthOptions& o,
                  const HtmlPlotOptions& plot, const analysis::ExitSummary& s,
                  const analysis::Diagnosis& diag, const HtmlExitCollector& exits) {
  p.meta.push_back(
      {fmt::format("{} \u2014 process {} (pid {}) on {} ({} {}, {})",
                   o.source.empty() ? "dump" : o.source, d.process.comm, d.process.pid,
                   d.host.nodename, d.host.sysname, d.host.release, d.host.cpu_model)});
  p.meta.push_back({fmt::format(
      "{} exits over {:.3f} s, {} inside exits; clock {}{}; slow-exit threshold {}; watchdog "
      "{}; guest data {}",
      s.exits, s.span_s(), FormatDurationNs(s.total_ns),
      d.clock.source == ClockSource::kTsc ? "TSC" : "CLOCK_MONOTONIC",
      d.clock.tsc_hz ? fmt::format(" at {:.3f} MHz", d.clock.tsc_hz / 1e6) : "",
      FormatDurationNs(d.slow_exit_threshold_ns), d.watchdog_running ? "on" : "off",
      d.includes_guest_data ? "INCLUDED" : "not included")});
  if (o.filter.vcpu || o.filter.device) {
    std::string f = "filter:";
    if (o.filter.vcpu) f += fmt::format(" vCPU {}", *o.filter.vcpu);
    if (o.filter.device) f += fmt::format(" device {}", *o.filter.device);
    p.meta.push_back({std::move(f)});
  }
  for (const std::string& w : d.warnings) p.meta.push_back({"warning: " + w, true});

  Section hists{"histograms", "Latency histograms", {}};
  hists.blocks.push_back(Note{kHistogramNote});
  const auto hist = [&](const char* id, const char* what, const ExitTable& t) {
    nlohmann::json c = html::HistogramPlot(id, fmt::format("Exit duration by {}", what),
                                           html::RowsOf(t), plot.histogram_series);
    const size_t left = c["left_out"].get<size_t>();
    hists.blocks.push_back(Plot{
        std::move(c), left ? fmt::format("{} more {} rows are in the tables below.", left, what)
                           : std::string()});
  };
  hist("hist-kind", "kind", s.by_kind);
  hist("hist-device", "device", s.by_device);
  hist("hist-register", "register", s.by_register);

  html::Timeline t = html::TimelinePlots(
      exits, plot,
      fmt::format("the recorder marked it slow (at least {}) or the watchdog saw it stuck",
                  FormatDurationNs(d.slow_exit_threshold_ns)));
  Section timeline{"timeline", "Exits over time", {}};
  timeline.blocks.push_back(Plot{std::move(t.chart), std::move(t.note)});
  timeline.blocks.push_back(Plot{std::move(t.rate), {}});

  Section tables{"tables", "Tables", {}};
  const double span = s.span_s();
  HealthTable(tables, "Exits by kind", "kind", s.by_kind, span, plot.table_rows);
  HealthTable(tables, "Exits by device", "device", s.by_device, span, plot.table_rows);
  HealthTable(tables, "Exits by register", "register", s.by_register, span, plot.table_rows);
  HealthTable(tables, "Exits by vCPU", "vCPU", s.by_vcpu, span, plot.table_rows);

  tables.blocks.push_back(Heading{fmt::format(
      "Slow exits (\u2265 {}): {}", FormatDurationNs(d.slow_exit_threshold_ns), s.slow.size())});
  if (!s.slow.empty()) {
    Table tab;
    tab.columns = {Col("at (s)"), Col("vCPU"), Key("exit"), Col("took"), Key("note")};
    size_t n = 0;
    for (const auto& e : s.slow) {
      if (n++ == plot.table_rows) break;
      tab.rows.push_back(
          {fmt::format("{:+.6f}",
                       (static_cast<double>(e.start_ns) - static_cast<double>(s.first_ns)) / 1e9),
           fmt::format("{}", e.vcpu), analysis::DescribeExit(e), FormatDurationNs(e.duration_ns),
           e.open_at_end() ? "in progress at dump time"
           : e.stalled()   ? "watchdog saw it stuck"
                           : ""});
    }
    tables.blocks.push_back(std::move(tab));
    if (s.slow.size() > plot.table_rows)
      tables.blocks.push_back(
          Note{fmt::format("{} more (--format json lists all)", s.slow.size() - plot.table_rows)});
  }
  tables.blocks.push_back(Heading{fmt::format("Watchdog findings: {}", s.findings.size())});
  if (!s.findings.empty()) {
    Table tab;
    tab.columns = {Col("at (s)"), Key("finding"), Key("I/Os in flight")};
    size_t n = 0;
    for (const auto& f : s.findings) {
      if (n++ == plot.table_rows) break;
      std::string io;
      for (const auto& x : f.in_flight)
        io += fmt::format("{}{} io {} for {}", io.empty() ? "" : "; ", x.device_name, x.io_id,
                          FormatDurationNs(x.age_ns));
      tab.rows.push_back(
          {fmt::format("{:+.6f}",
                       (static_cast<double>(f.time_ns) - static_cast<double>(s.first_ns)) / 1e9),
           std::string(f.text.empty() ? ToString(f.type) : f.text), std::move(io)});
    }
    tables.blocks.push_back(std::move(tab));
    // Each captured stack behind its own summary, in the table's order: what the stuck vCPU
    // thread was doing (kernel frames "k", user frames "u", innermost first; the note).
    n = 0;
    for (const auto& f : s.findings) {
      if (n++ == plot.table_rows) break;
      if (f.stack == nullptr) continue;
      std::string text;
      for (const std::string& line : StackFrameLines(*f.stack, /*marked=*/true))
        text += line + "\n";
      if (!f.stack->note.empty()) text += "note: " + f.stack->note + "\n";
      tables.blocks.push_back(Details{
          fmt::format("Stack at {:+.6f} s, {} of vCPU {}: {}",
                      (static_cast<double>(f.time_ns) - static_cast<double>(s.first_ns)) / 1e9,
                      ToString(f.type), f.vcpu, StackHeadline(*f.stack)),
          std::move(text)});
    }
  }
  const auto& l = s.losses;
  const auto num = [](uint64_t v) { return fmt::format("{}", v); };
  tables.blocks.push_back(Heading{"Records"});
  tables.blocks.push_back(Table{
      {Key("what"), Col("written"), Col("overwritten"), Col("dropped"), Col("skipped (torn)")},
      {{"exits", num(l.exits_written), num(l.exits_overwritten), "-", num(l.exits_skipped)},
       {"device events", num(l.device_events_written), num(l.device_events_overwritten),
        num(l.device_events_dropped), num(l.device_events_skipped)},
       {"findings", "-", "-", num(l.findings_dropped), "-"}}});

  ExitHealthOptions text = o;
  text.format = OutputFormat::kTable;
  text.max_rows = 0;
  text.max_notable = 0;
  text.events = true;
  tables.blocks.push_back(Details{"The text report (exitscope inspect, every row)",
                                  RenderExitHealthTable(d, s, diag, text)});
  p.sections.push_back(std::move(hists));
  p.sections.push_back(std::move(timeline));
  p.sections.push_back(std::move(tables));
}

HtmlExitCollector DumpCollector(const analysis::SummaryFilter& f) {
  // Slow: as the summary's slow exits (exit_summary.h kDumpSlowRule).
  return HtmlExitCollector(analysis::kDumpSlowRule, [f](const ExitEvent& e) {
    if (f.vcpu && e.vcpu != *f.vcpu) return false;
    if (!f.device) return true;
    return *f.device == "unassigned" ? e.device.empty() : e.device == *f.device;
  });
}

// The joint view's split as stacked bars, and its tables.
void JointSections(html::Page& p, const analysis::JointView& v, const JointRenderOptions& o,
                   const HtmlPlotOptions& plot) {
  const analysis::JointGroups g = analysis::GroupJointExits(v.matched);
  const bool sched = v.sched_recorded;
  Section split{"split", "Joint view: where each exit's time went", {}};
  split.blocks.push_back(Note{fmt::format(
      "{} + {} ({}): {} exits matched of {} VMM exits and {} kernel userspace exits. Each "
      "exit's kernel time = kernel before (exit to handler start) + handler (VMM) + kernel "
      "after (handler end to guest entry){}. Bars: each part's share of the row's summed "
      "kernel time (the parts add up to 100%); beside each row its exit count and mean kernel "
      "time; the tooltip gives each part's mean, p50 and p99.",
      o.dump, o.trace, v.trace_format, v.matched.size(), v.vmm_exits, v.kernel_exits,
      sched ? fmt::format(" + off-CPU (the vCPU thread switched out, from {} sched_switch "
                          "records; the other parts are then on-CPU time)",
                          v.sched_switches)
            : "; the trace has no sched_switch records, so off-CPU time is inside the parts")});
  for (const std::string& w : v.warnings) split.blocks.push_back(Note{"warning: " + w, true});
  split.blocks.push_back(
      html::JointSplitPlot("split-kind", "kind", g.by_kind, sched, plot.table_rows));
  split.blocks.push_back(
      html::JointSplitPlot("split-device", "device", g.by_device, sched, plot.table_rows));
  split.blocks.push_back(
      html::JointSplitPlot("split-register", "register", g.by_register, sched, plot.table_rows));

  const auto table = [&](const char* heading, const std::vector<analysis::JointGroup>& groups) {
    split.blocks.push_back(Heading{heading});
    Table tab;
    tab.columns = {Key("key")};
    Cols(tab, {"count", "kernel p50/p99", "before p50/p99", "handler p50/p99", "after p50/p99"});
    if (sched) tab.columns.push_back(Col("off-CPU p50/p99"));
    tab.columns.push_back(Col("handler share p50/p99"));
    const auto pair = [](const analysis::JointPart& x) {
      return fmt::format("{} / {}", FormatDurationNs(x.p50_ns), FormatDurationNs(x.p99_ns));
    };
    size_t n = 0;
    for (const analysis::JointGroup& r : groups) {
      if (n++ == plot.table_rows) break;
      std::vector<std::string> row = {r.key,           fmt::format("{}", r.count),
                                      pair(r.total),   pair(r.before),
                                      pair(r.handler), pair(r.after)};
      if (sched) row.push_back(pair(r.off_cpu));
      row.push_back(
          fmt::format("{:.0f}% / {:.0f}%", r.handler.share_p50 * 100, r.handler.share_p99 * 100));
      tab.rows.push_back(std::move(row));
    }
    split.blocks.push_back(std::move(tab));
  };
  table("Joint view by kind", g.by_kind);
  table("Joint view by device", g.by_device);
  table("Joint view by register", g.by_register);
  JointRenderOptions text = o;
  text.rows = 0;
  split.blocks.push_back(Details{"The joint view's text report (slowest exits, unmatched exits)",
                                 RenderJointTable(v, text)});
  p.sections.push_back(std::move(split));
}

// `kvm stat --bpf --stacks`: the slow exits seen from the kernel, a table, then each exit's
// stacks behind its own summary as the watchdog findings' are (offcpu_report.h's text).
Section OffCpuSection(const analysis::OffCpuSlowExits& s, const HtmlPlotOptions& plot) {
  Section sec{"kernel-slow-exits", "Slow exits seen from the kernel", {}};
  sec.blocks.push_back(Heading{"Slow exits seen from the kernel, with their stacks"});
  sec.blocks.push_back(Note{fmt::format(
      "{} exit{} {} or longer, slowest first{}. A vCPU thread is inside an exit from kvm_exit "
      "(or kvm_userspace_exit) to its next KVM_RUN; below, where it went off the CPU "
      "(sched_switch) and for how long.",
      s.seen(), s.seen() == 1 ? "" : "s", FormatDurationNs(s.options().slow_ns),
      s.left_out() != 0
          ? fmt::format(" (the {} slowest kept, {} more counted)", s.exits().size(), s.left_out())
          : "")});
  if (s.exits().empty()) return sec;
  Table tab;
  tab.columns = {
      Col("tid"),         Col("pid"),      Key("kind"),       Col("inside"),
      Col("off the CPU"), Col("switches"), Key("blocked in"), Key("the VMM's own frame")};
  size_t n = 0;
  for (const analysis::OffCpuSlowExit& e : s.exits()) {
    if (n++ == plot.table_rows) break;
    const ThreadStack* top = e.stacks.empty() ? nullptr : &e.stacks.front();
    const StackFrame* k = top ? analysis::BlockingKernelFrame(*top) : nullptr;
    const StackFrame* u = top ? analysis::OwnUserFrame(*top) : nullptr;
    tab.rows.push_back(
        {fmt::format("{}", e.exit.tid), fmt::format("{}", e.exit.tgid),
         analysis::OffCpuKindText(e.exit.kind) + (e.stuck ? " (stuck at the end)" : ""),
         FormatDurationNs(e.inside_ns()), FormatDurationNs(e.exit.off_ns),
         fmt::format("{}", e.exit.switches), k ? k->function : "-", u ? u->function : "-"});
  }
  sec.blocks.push_back(std::move(tab));
  n = 0;
  for (const analysis::OffCpuSlowExit& e : s.exits()) {
    if (n++ == plot.table_rows) break;
    sec.blocks.push_back(
        Details{fmt::format("Stacks of tid {}: {}", e.exit.tid, OffCpuExitHeadline(e)),
                OffCpuExitText(e, e.stuck ? "Stuck at the end" : "Slow exit")});
  }
  if (s.exits().size() > plot.table_rows)
    sec.blocks.push_back(Note{
        fmt::format("{} more (--format json lists all kept)", s.exits().size() - plot.table_rows)});
  for (const std::string& note : s.notes()) sec.blocks.push_back(Note{"note: " + note});
  return sec;
}

// kvm report's page: its header, the plots, and the text report's tables.
void KvmSections(html::Page& p, const analysis::KvmAnalysis& a, const KvmReportContext& ctx,
                 const KvmRenderOptions& opts, const HtmlExitCollector* exits,
                 std::string_view slow_rule, const HtmlPlotOptions& plot) {
  const ExitTable& all = a.all;
  p.meta.push_back({fmt::format(
      "{} ({}), clock {}{}; event class {} ({}); {} samples, {} exits seen, {} open at end of "
      "trace; {} records lost at record time",
      ctx.input, ctx.format, ctx.clock,
      ctx.tsc_khz ? fmt::format(", TSC {:.3f} MHz{}", ctx.tsc_khz / 1e3,
                                ctx.tsc_khz_from_host ? " (this host's)" : "")
                  : "",
      analysis::ToString(a.event), analysis::KvmEventTitle(a.event), all.samples, a.exits_seen,
      a.open_at_end, ctx.lost_at_record)});
  if (ctx.pid >= 0 || ctx.vcpu >= 0)
    p.meta.push_back(
        {fmt::format("filter:{}{}", ctx.pid >= 0 ? fmt::format(" pid {}", ctx.pid) : "",
                     ctx.vcpu >= 0 ? fmt::format(" vCPU {}", ctx.vcpu) : "")});

  Section hists{"histograms", "Latency histograms", {}};
  hists.blocks.push_back(Note{kHistogramNote});
  {
    nlohmann::json c =
        html::HistogramPlot("hist-key", fmt::format("Exit duration by {}", KvmEventTitle(a.event)),
                            html::RowsOf(all), plot.histogram_series);
    const size_t left = c["left_out"].get<size_t>();
    hists.blocks.push_back(
        Plot{std::move(c),
             left ? fmt::format("{} more rows are in the table below.", left) : std::string()});
  }
  // The same exits by the device and the register they touched (resolved with --device-map
  // or --qmp; "unassigned" without one).
  if (exits != nullptr && !exits->by_device().rows.empty()) {
    hists.blocks.push_back(
        Plot{html::HistogramPlot("hist-device", "Exit duration by device",
                                 html::RowsOf(exits->by_device()), plot.histogram_series),
             {}});
    hists.blocks.push_back(
        Plot{html::HistogramPlot("hist-register", "Exit duration by register",
                                 html::RowsOf(exits->by_register()), plot.histogram_series),
             {}});
  }

  // Without the exits one by one (the eBPF maps keep distributions): no timeline.
  Section timeline{"timeline", "Exits over time", {}};
  if (exits != nullptr) {
    html::Timeline t = html::TimelinePlots(*exits, plot, slow_rule);
    timeline.blocks.push_back(Plot{std::move(t.chart), std::move(t.note)});
    timeline.blocks.push_back(Plot{std::move(t.rate), {}});
  }

  Section tables{"tables", "Tables", {}};
  const auto table = [&](const ExitTable& g) {
    tables.blocks.push_back(Heading{
        g.vm < 0 && g.vcpu < 0 ? std::string("All")
                               : fmt::format("{}{}", g.vm >= 0 ? fmt::format("VM {} ", g.vm) : "",
                                             g.vcpu >= 0 ? fmt::format("vCPU {}", g.vcpu) : "")});
    Table tab;
    tab.columns = {Key(std::string(analysis::KvmEventTitle(a.event)))};
    Cols(tab, {"Samples", "Samples%", "Time%", "Min", "Max", "Avg", "+-", "p50", "p99", "p99.9",
               "To VMM", "In kernel"});
    tab.columns.push_back(Key("Name"));
    size_t n = 0;
    for (const auto& r : g.rows) {
      if (n++ == plot.table_rows) break;
      const LatencyStats& s = r->stats;
      const bool timed = s.count() > 0;
      const auto d = [&](uint64_t ns) { return timed ? FormatDurationNs(ns) : std::string("-"); };
      tab.rows.push_back(
          {r->key, fmt::format("{}", r->samples()), PercentText(r->samples(), g.samples),
           timed ? PercentText(s.sum(), g.time_ns) : "-", d(s.min()), d(s.max()),
           d(static_cast<uint64_t>(s.mean())),
           timed ? fmt::format("{:.2f}%", s.RelStdErrPercent()) : "-", d(s.Quantile(0.5)),
           d(s.Quantile(0.99)), d(s.Quantile(0.999)), fmt::format("{}", r->to_vmm()),
           fmt::format("{}", r->in_kernel), r->name});
    }
    tables.blocks.push_back(std::move(tab));
    if (g.rows.size() > plot.table_rows)
      tables.blocks.push_back(Note{
          fmt::format("{} more rows (--format json lists all)", g.rows.size() - plot.table_rows)});
  };
  table(all);
  if (opts.per_vm)
    for (const auto& g : a.per_vm) table(*g);
  if (opts.per_vcpu)
    for (const auto& g : a.per_vcpu) table(*g);
  tables.blocks.push_back(
      Details{"The text report (exitscope kvm report)", RenderKvmTable(a, ctx, opts)});
  p.sections.push_back(std::move(hists));
  if (exits != nullptr) p.sections.push_back(std::move(timeline));
  if (ctx.offcpu != nullptr) p.sections.push_back(OffCpuSection(*ctx.offcpu, plot));
  p.sections.push_back(std::move(tables));
}

}  // namespace

// ---- the three pages -------------------------------------------------------------------

std::string_view HtmlUnavailable() {
  return PlotLibraryMissing();
}

std::string RenderExitHealthHtml(const Dump& dump, const ExitHealthOptions& options,
                                 const HtmlPlotOptions& plot) {
  HtmlExitCollector exits = DumpCollector(options.filter);
  analysis::DiagnosisBuilder diag(DumpDiagnosisOptions(options.filter));
  TeeSink tee({&exits, &diag});
  const analysis::ExitSummary s = analysis::Summarize(dump, options.filter, &tee);
  const analysis::Diagnosis d = diag.Finish();
  html::Page p;
  p.title = "exitscope exit-health report: " + (options.source.empty() ? "dump" : options.source);
  p.sections.push_back(DiagnosisSection(d, DumpDiagnosisText(dump, options), true));
  DumpSections(p, dump, options, plot, s, d, exits);
  return html::RenderPage(p);
}

std::string RenderJointHtml(const Dump& dump, const analysis::JointView& view,
                            const JointRenderOptions& o, const HtmlPlotOptions& plot) {
  ExitHealthOptions ho;
  ho.source = o.dump;
  HtmlExitCollector exits = DumpCollector(ho.filter);
  analysis::DiagnosisBuilder diag(DumpDiagnosisOptions(ho.filter));
  TeeSink tee({&exits, &diag});
  const analysis::ExitSummary s = analysis::Summarize(dump, ho.filter, &tee);
  html::Page p;
  p.title = fmt::format("exitscope joint view: {} + {}", o.dump, o.trace);
  p.sections.push_back(
      DiagnosisSection(analysis::DiagnoseJoint(view, o.slow_ns), JointDiagnosisText(o), true));
  JointSections(p, view, o, plot);
  DumpSections(p, dump, ho, plot, s, diag.Finish(), exits);
  return html::RenderPage(p);
}

std::string RenderKvmHtml(const analysis::KvmAnalysis& a, const KvmReportContext& ctx,
                          const KvmRenderOptions& opts, const HtmlExitCollector* exits,
                          std::string_view slow_rule, const HtmlPlotOptions& plot) {
  html::Page p;
  p.title =
      fmt::format("exitscope {}: {}",
                  ctx.offcpu != nullptr ? "kvm stat --bpf --stacks" : "kvm report", ctx.input);
  if (ctx.diagnosis != nullptr)
    p.sections.push_back(DiagnosisSection(*ctx.diagnosis, ctx.diagnosis_text, exits != nullptr));
  KvmSections(p, a, ctx, opts, exits, slow_rule, plot);
  return html::RenderPage(p);
}

}  // namespace exitscope::report
