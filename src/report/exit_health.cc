#include "report/exit_health.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "report/format.h"
#include "report/row_json.h"

namespace exitscope::report {
namespace {

using analysis::ExitRow;
using analysis::ExitSummary;
using analysis::ExitTable;
using base::LatencyStats;

// Time of `ns` relative to the start of the recording, "+12.345678 s".
std::string Rel(uint64_t ns, uint64_t origin) {
  if (ns < origin) return fmt::format("-{:.6f} s", (origin - ns) / 1e9);
  return fmt::format("+{:.6f} s", (ns - origin) / 1e9);
}

// The rows of `table` in the order the summary sorted them.
void GroupTable(std::string& out, const char* title, const char* key_name, const ExitTable& table,
                double span_s, size_t max_rows) {
  const auto& groups = table.rows;
  if (groups.empty()) return;
  size_t w = std::string_view(key_name).size();
  for (const auto& g : groups) w = std::max(w, g->key.size());
  w = std::min<size_t>(w, 48);
  out += fmt::format("\n{}\n", title);
  out += fmt::format("  {:<{}} {:>10} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10}\n", key_name,
                     w, "count", "rate/s", "total", "min", "p50", "p99", "p99.9", "max");
  size_t shown = 0;
  for (const auto& g : groups) {
    if (max_rows && shown == max_rows) {
      out += fmt::format("  ... {} more (--format json lists all)\n", groups.size() - shown);
      break;
    }
    ++shown;
    const LatencyStats& s = g->stats;
    const std::string rate = span_s > 0 ? fmt::format("{:.1f}", s.count() / span_s) : "-";
    out += fmt::format("  {:<{}} {:>10} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10}\n", g->key,
                       w, s.count(), rate, FormatDurationNs(s.sum()), FormatDurationNs(s.min()),
                       FormatDurationNs(s.Quantile(0.5)), FormatDurationNs(s.Quantile(0.99)),
                       FormatDurationNs(s.Quantile(0.999)), FormatDurationNs(s.max()));
  }
}

// The same list, in the same order, as the run summary's "in the kernel (KVM stats)" lines.
constexpr std::string_view kKvmExitCounters[] = {
    "exits",          "halt_exits",   "irq_exits",           "insn_emulation",    "mmio_exits",
    "io_exits",       "signal_exits", "irq_window_exits",    "pf_taken",          "pf_fixed",
    "pf_emulate",     "pf_guest",     "fpu_reload",          "host_state_reload", "halt_wakeup",
    "irq_injections", "hypercalls",   "insn_emulation_fail", "request_irq_exits"};

// The embedder's named counters of the vCPUs that pass the filter, as rows in report order:
// the KVM exit counters first, then the other kvm.* counters, then the embedder's own.
struct CounterTable {
  std::vector<const DumpVcpu*> vcpus;  // columns
  std::vector<std::string> exit_rows;  // "kvm.exits", ... (present on at least one vCPU)
  std::vector<std::string> other_rows;
  size_t zero_rows_hidden = 0;  // other rows 0 on every vCPU, left out unless `all`
};

CounterTable BuildCounterTable(const Dump& d, const analysis::SummaryFilter& filter, bool all) {
  CounterTable t;
  std::set<std::string> names;
  for (const DumpVcpu& v : d.vcpus) {
    if (filter.vcpu && v.vcpu != *filter.vcpu) continue;
    if (v.named_counters.empty()) continue;
    t.vcpus.push_back(&v);
    for (const auto& [name, value] : v.named_counters) names.insert(name);
  }
  for (std::string_view k : kKvmExitCounters) {
    auto it = names.find("kvm." + std::string(k));
    if (it == names.end()) continue;
    t.exit_rows.push_back(*it);
    names.erase(it);
  }
  // kvm.* first (std::set order puts them together), then the embedder's own counters.
  std::vector<std::string> rest(names.begin(), names.end());
  std::stable_partition(rest.begin(), rest.end(),
                        [](const std::string& n) { return n.rfind("kvm.", 0) == 0; });
  for (std::string& name : rest) {
    const bool nonzero = std::any_of(t.vcpus.begin(), t.vcpus.end(), [&](const DumpVcpu* v) {
      auto it = v->named_counters.find(name);
      return it != v->named_counters.end() && it->second != 0;
    });
    if (all || nonzero)
      t.other_rows.push_back(std::move(name));
    else
      ++t.zero_rows_hidden;
  }
  return t;
}

void CounterTableText(std::string& out, const CounterTable& t) {
  if (t.vcpus.empty()) return;
  out +=
      "\nPer-vCPU counters from the VMM (kvm.*: KVM binary stats, every exit the kernel saw, "
      "most handled there)\n";
  size_t w = std::string_view("counter").size();
  for (const auto* rows : {&t.exit_rows, &t.other_rows})
    for (const std::string& r : *rows) w = std::max(w, r.size());
  constexpr size_t kColumns = 6;  // vCPUs side by side; more go in the next block
  for (size_t first = 0; first < t.vcpus.size(); first += kColumns) {
    const size_t last = std::min(t.vcpus.size(), first + kColumns);
    out += fmt::format("  {:<{}}", "counter", w);
    for (size_t c = first; c < last; ++c)
      out += fmt::format(" {:>14}", fmt::format("vCPU {}", t.vcpus[c]->vcpu));
    out += "\n";
    auto row = [&](const std::string& name) {
      out += fmt::format("  {:<{}}", name, w);
      for (size_t c = first; c < last; ++c) {
        auto it = t.vcpus[c]->named_counters.find(name);
        out += it == t.vcpus[c]->named_counters.end() ? fmt::format(" {:>14}", "-")
                                                      : fmt::format(" {:>14}", it->second);
      }
      out += "\n";
    };
    for (const std::string& name : t.exit_rows) row(name);
    if (!t.exit_rows.empty() && !t.other_rows.empty()) out += "  (other counters)\n";
    for (const std::string& name : t.other_rows) row(name);
  }
  if (t.zero_rows_hidden > 0)
    out += fmt::format("  ... {} more counter{}, 0 on every vCPU (--all lists them)\n",
                       t.zero_rows_hidden, t.zero_rows_hidden == 1 ? "" : "s");
}

// "vCPU 0 tid 4300, vCPU 1 tid 4301" for the vCPUs that pass the filter and whose thread id
// is known; "" when none is.
std::string ThreadIds(const Dump& d, const analysis::SummaryFilter& filter) {
  std::string out;
  for (const DumpVcpu& v : d.vcpus) {
    if ((filter.vcpu && v.vcpu != *filter.vcpu) || v.tid == 0) continue;
    out += fmt::format("{}vCPU {} tid {}", out.empty() ? "" : ", ", v.vcpu, v.tid);
  }
  return out;
}

// A captured stack as JSON (docs/json.md "Stacks").
nlohmann::json StackJson(const ThreadStack& st) {
  const auto frames = [](const std::vector<StackFrame>& fs) {
    nlohmann::json a = nlohmann::json::array();
    for (const StackFrame& f : fs)
      a.push_back({{"ip", fmt::format("{:#x}", f.ip)},
                   {"function", f.function},
                   {"offset", f.offset},
                   {"module", f.module},
                   {"file", f.file},
                   {"line", f.line}});
    return a;
  };
  return {{"tid", st.tid},          {"state", StackStateText(st.state)},
          {"capture", st.capture},  {"user_dropped", st.user_dropped},
          {"note", st.note},        {"kernel", frames(st.kernel)},
          {"user", frames(st.user)}};
}

std::string FindingLine(const analysis::KeptFinding& f) {
  return std::string(f.text.empty() ? ToString(f.type) : f.text);
}

void SlowExitList(std::string& out, const Dump& d, const ExitSummary& s,
                  const ExitHealthOptions& o) {
  out += fmt::format("\nSlow exits (>= {}): {}\n", FormatDurationNs(d.slow_exit_threshold_ns),
                     s.slow.size());
  size_t n = 0;
  for (const auto& e : s.slow) {
    if (o.max_notable && n++ == o.max_notable) {
      out += fmt::format("  ... {} more\n", s.slow.size() - o.max_notable);
      break;
    }
    out +=
        fmt::format("  {}  vCPU {}: {} {} {}{}\n", Rel(e.start_ns, s.first_ns), e.vcpu,
                    analysis::DescribeExit(e), e.open_at_end() ? "in progress for" : "took",
                    FormatDurationNs(e.duration_ns), e.stalled() ? " (watchdog saw it stuck)" : "");
  }
}

void FindingList(std::string& out, const ExitSummary& s, const ExitHealthOptions& o) {
  out += fmt::format("\nWatchdog findings: {}\n", s.findings.size());
  size_t n = 0;
  for (const auto& f : s.findings) {
    if (o.max_notable && n++ == o.max_notable) {
      out += fmt::format("  ... {} more\n", s.findings.size() - o.max_notable);
      break;
    }
    out += fmt::format("  {}  {}\n", Rel(f.time_ns, s.first_ns), FindingLine(f));
    for (const auto& io : f.in_flight)
      out += fmt::format("      in flight: {} io {} for {}\n", io.device_name, io.io_id,
                         FormatDurationNs(io.age_ns));
    if (f.stack != nullptr) {
      out += fmt::format("      stack: {}\n", StackHeadline(*f.stack));
      for (const std::string& line : StackFrameLines(*f.stack, /*marked=*/true))
        out += fmt::format("        {}\n", line);
      if (!f.stack->note.empty()) out += fmt::format("      note: {}\n", f.stack->note);
    }
  }
}

// The slow exits, one line per cause (the diagnosis's slow and open groups).
void SlowExitGroups(std::string& out, const Dump& d, const ExitSummary& s,
                    const analysis::Diagnosis& diag) {
  size_t groups = 0;
  for (const auto& g : diag.groups) groups += g.slow || g.open ? 1 : 0;
  out += fmt::format(
      "\nSlow exits (>= {}): {}{}\n", FormatDurationNs(d.slow_exit_threshold_ns), s.slow.size(),
      s.slow.empty()
          ? ""
          : fmt::format(", {} cause{} (--events lists each exit)", groups, groups == 1 ? "" : "s"));
  for (const auto& g : diag.groups) {
    if (!g.slow && !g.open) continue;
    uint64_t stuck = 0;
    for (const auto& e : g.evidence)
      if (e.kind == "stuck") stuck = e.exits;
    out += fmt::format(
        "  {}: {} exit{}{} on vCPU{} {}, +{:.6f} s .. +{:.6f} s; p50 {}, p90 {}, max {}{}\n",
        g.cause, g.count, g.count == 1 ? "" : "s", g.open ? " still inside at the end" : "",
        g.vcpus.size() == 1 ? "" : "s", fmt::format("{}", fmt::join(g.vcpus, ",")),
        g.first_ns / 1e9, g.last_ns / 1e9, FormatDurationNs(g.typical_ns),
        FormatDurationNs(g.p90_ns), FormatDurationNs(g.worst_ns),
        stuck ? fmt::format(" ({} seen stuck by the watchdog)", stuck) : "");
  }
}

// The findings, one line per kind of finding, device register and vCPU.
void FindingGroups(std::string& out, const ExitSummary& s) {
  struct Group {
    uint64_t count = 0, first = 0, last = 0, with_io = 0, with_stack = 0;
  };
  std::map<std::string, Group> groups;
  std::vector<std::string> order;
  for (const auto& f : s.findings) {
    std::string key = std::string(ToString(f.type));
    if (!f.device.empty()) key += fmt::format(" {}{}{}", f.device, f.reg.empty() ? "" : ".", f.reg);
    if (f.type != FindingType::kAgedIo) key += fmt::format(" (vCPU {})", f.vcpu);
    auto [it, added] = groups.try_emplace(key);
    if (added) {
      order.push_back(key);
      it->second.first = f.time_ns;
    }
    Group& g = it->second;
    ++g.count;
    g.last = f.time_ns;
    g.with_io += f.in_flight.empty() ? 0 : 1;
    g.with_stack += f.stack != nullptr ? 1 : 0;
  }
  out += fmt::format("\nWatchdog findings: {}{}\n", s.findings.size(),
                     s.findings.empty() ? "" : " (--events lists each, with its I/Os and stack)");
  for (const std::string& k : order) {
    const Group& g = groups[k];
    out += fmt::format("  {}: {}, {} .. {}", k, g.count, Rel(g.first, s.first_ns),
                       Rel(g.last, s.first_ns));
    if (g.with_io) out += fmt::format("; {} with I/O in flight", g.with_io);
    if (g.with_stack) out += fmt::format("; {} with a stack", g.with_stack);
    out += "\n";
  }
}

std::string RenderTable(const Dump& d, const ExitSummary& s, const analysis::Diagnosis& diag,
                        const ExitHealthOptions& o) {
  std::string out;
  out += fmt::format("exitscope exit-health report: {}\n", o.source.empty() ? "dump" : o.source);
  out += fmt::format("  process   {} (pid {}) on {} ({} {}, {})\n", d.process.comm, d.process.pid,
                     d.host.nodename, d.host.sysname, d.host.release, d.host.cpu_model);
  for (const auto& [k, v] : d.attributes) out += fmt::format("  {:<9} {}\n", k, v);
  out += fmt::format(
      "  clock     {}{}; slow-exit threshold {}; watchdog {} (stuck {}, I/O age {})\n",
      d.clock.source == ClockSource::kTsc ? "TSC" : "CLOCK_MONOTONIC",
      d.clock.tsc_hz ? fmt::format(" at {:.3f} MHz", d.clock.tsc_hz / 1e6) : "",
      FormatDurationNs(d.slow_exit_threshold_ns), d.watchdog_running ? "on" : "off",
      FormatDurationNs(d.watchdog.stuck_exit_ns), FormatDurationNs(d.watchdog.io_age_ns));
  out += fmt::format("  guest data {}\n", d.includes_guest_data ? "INCLUDED" : "not included");
  if (const std::string t = ThreadIds(d, o.filter); !t.empty())
    out += fmt::format("  threads   {}\n", t);
  for (const std::string& w : d.warnings) out += fmt::format("  warning   {}\n", w);
  if (o.filter.vcpu || o.filter.device) {
    out += "  filter   ";
    if (o.filter.vcpu) out += fmt::format(" vCPU {}", *o.filter.vcpu);
    if (o.filter.device) out += fmt::format(" device {}", *o.filter.device);
    out += "\n";
  }
  out += "\n" + DiagnosisText(diag, DumpDiagnosisText(d, o));
  out += fmt::format("{} exits over {:.3f} s, {} inside exits ({} per exit on average)\n", s.exits,
                     s.span_s(), FormatDurationNs(s.total_ns),
                     FormatDurationNs(s.exits ? s.total_ns / s.exits : 0));

  const double span = s.span_s();
  GroupTable(out, "Exits by kind", "kind", s.by_kind, span, o.max_rows);
  GroupTable(out, "Exits by device", "device", s.by_device, span, o.max_rows);
  GroupTable(out, "Exits by register", "register", s.by_register, span, o.max_rows);
  GroupTable(out, "Exits by vCPU", "vCPU", s.by_vcpu, span, o.max_rows);

  if (o.events) {
    SlowExitList(out, d, s, o);
    FindingList(out, s, o);
  } else {
    SlowExitGroups(out, d, s, diag);
    FindingGroups(out, s);
  }

  CounterTableText(out, BuildCounterTable(d, o.filter, o.max_rows == 0));

  const auto& l = s.losses;
  out += fmt::format(
      "\nRecords: {} exits written, {} overwritten (ring full), {} skipped (torn); device events: "
      "{} written, {} overwritten, {} dropped, {} skipped; findings dropped {}\n",
      l.exits_written, l.exits_overwritten, l.exits_skipped, l.device_events_written,
      l.device_events_overwritten, l.device_events_dropped, l.device_events_skipped,
      l.findings_dropped);
  const StackCounters& sc = d.stack_counters;
  if (sc.captures || sc.signal_timeouts || sc.exit_changed || sc.frames_dropped ||
      sc.captures_skipped)
    out += fmt::format(
        "Stack captures: {} attached to findings; {} signal timeouts, {} after the exit ended, "
        "{} user frames dropped, {} captures skipped\n",
        sc.captures, sc.signal_timeouts, sc.exit_changed, sc.frames_dropped, sc.captures_skipped);
  if (l.bad_vcpu || l.end_without_begin || l.begin_without_end || l.io_inflight_overflow)
    out += fmt::format(
        "API misuse: bad vCPU {}, end without begin {}, begin without end {}, "
        "in-flight I/O table overflow {}\n",
        l.bad_vcpu, l.end_without_begin, l.begin_without_end, l.io_inflight_overflow);
  return out;
}

nlohmann::json StatsJson(const LatencyStats& s) {
  return {{"count", s.count()},        {"total_ns", s.sum()},        {"min_ns", s.min()},
          {"p50_ns", s.Quantile(0.5)}, {"p99_ns", s.Quantile(0.99)}, {"p999_ns", s.Quantile(0.999)},
          {"max_ns", s.max()},         {"mean_ns", s.mean()}};
}

// One row object each (row_json.h, docs/json.md), in the summary's order.
nlohmann::json GroupsJson(const ExitTable& table) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : table.rows) a.push_back(RowJson(*r, table, /*histogram=*/false));
  return a;
}

std::string RenderJson(const Dump& d, const ExitSummary& s, const analysis::Diagnosis& diag,
                       const ExitHealthOptions& o) {
  nlohmann::json j;
  j["schema"] = "exitscope.exit-health.v1";
  j["source"] = o.source;
  j["diagnosis"] = DiagnosisJson(diag, DumpDiagnosisText(d, o));
  j["process"] = {{"pid", d.process.pid}, {"comm", d.process.comm}, {"argv", d.process.argv}};
  j["host"] = {{"nodename", d.host.nodename},
               {"release", d.host.release},
               {"cpu_model", d.host.cpu_model},
               {"cpus", d.host.cpus}};
  j["attributes"] = nlohmann::json::object();
  for (const auto& [k, v] : d.attributes) j["attributes"][k] = v;
  j["clock"] = {{"source", d.clock.source == ClockSource::kTsc ? "tsc" : "monotonic"},
                {"tsc_hz", d.clock.tsc_hz}};
  j["includes_guest_data"] = d.includes_guest_data;
  j["slow_exit_threshold_ns"] = d.slow_exit_threshold_ns;
  j["filter"] = {{"vcpu", o.filter.vcpu ? nlohmann::json(*o.filter.vcpu) : nlohmann::json()},
                 {"device", o.filter.device ? nlohmann::json(*o.filter.device) : nlohmann::json()}};
  j["exits"] = s.exits;
  j["span_ns"] = s.last_ns - s.first_ns;
  j["all"] = StatsJson(s.all);
  j["by_kind"] = GroupsJson(s.by_kind);
  j["by_device"] = GroupsJson(s.by_device);
  j["by_register"] = GroupsJson(s.by_register);
  j["by_vcpu"] = GroupsJson(s.by_vcpu);
  j["slow_exits"] = nlohmann::json::array();
  for (const auto& e : s.slow) {
    j["slow_exits"].push_back({{"start_ns", e.start_ns},
                               {"duration_ns", e.duration_ns},
                               {"vcpu", e.vcpu},
                               {"kind", ToString(e.kind)},
                               {"dir", ToString(e.dir)},
                               {"size", e.size},
                               {"addr", e.subkey},
                               {"target", analysis::TargetName(e.view())},
                               {"description", analysis::DescribeExit(e)},
                               {"stalled", e.stalled()},
                               {"in_progress", e.open_at_end()}});
  }
  j["findings"] = nlohmann::json::array();
  for (const auto& f : s.findings) {
    nlohmann::json in_flight = nlohmann::json::array();
    for (const auto& io : f.in_flight)
      in_flight.push_back({{"device", io.device_name},
                           {"io_id", io.io_id},
                           {"submitted_ns", io.submitted_ns},
                           {"age_ns", io.age_ns}});
    j["findings"].push_back(
        {{"time_ns", f.time_ns},
         {"type", ToString(f.type)},
         {"vcpu", f.vcpu},
         {"duration_ns", f.duration_ns},
         {"device", f.device},
         {"io_id", f.io_id},
         {"text", f.text},
         {"in_flight", std::move(in_flight)},
         {"stack", f.stack != nullptr ? StackJson(*f.stack) : nlohmann::json()}});
  }
  j["vcpus"] = nlohmann::json::array();
  for (const DumpVcpu& v : d.vcpus) {
    if (o.filter.vcpu && v.vcpu != *o.filter.vcpu) continue;
    j["vcpus"].push_back(
        {{"vcpu", v.vcpu}, {"tid", v.tid != 0 ? nlohmann::json(v.tid) : nlohmann::json()}});
  }
  const StackCounters& sc = d.stack_counters;
  j["stack_counters"] = {{"captures", sc.captures},
                         {"signal_timeouts", sc.signal_timeouts},
                         {"exit_changed", sc.exit_changed},
                         {"frames_dropped", sc.frames_dropped},
                         {"captures_skipped", sc.captures_skipped}};
  j["vcpu_counters"] = nlohmann::json::object();
  for (const auto& [k, v] : s.vcpu_counters) j["vcpu_counters"][k] = v;
  // The same counters per vCPU, every one (zeros too), and which of them are exit counters.
  const CounterTable t = BuildCounterTable(d, o.filter, /*all=*/true);
  j["kvm_exit_counters"] = t.exit_rows;
  j["counters_by_vcpu"] = nlohmann::json::array();
  for (const DumpVcpu* v : t.vcpus) {
    nlohmann::json c = nlohmann::json::object();
    for (const auto& [k, value] : v->named_counters) c[k] = value;
    j["counters_by_vcpu"].push_back({{"vcpu", v->vcpu}, {"counters", std::move(c)}});
  }
  const auto& l = s.losses;
  j["losses"] = {{"exits_written", l.exits_written},
                 {"exits_overwritten", l.exits_overwritten},
                 {"exits_skipped", l.exits_skipped},
                 {"device_events_written", l.device_events_written},
                 {"device_events_overwritten", l.device_events_overwritten},
                 {"device_events_dropped", l.device_events_dropped},
                 {"device_events_skipped", l.device_events_skipped},
                 {"findings_dropped", l.findings_dropped},
                 {"bad_vcpu", l.bad_vcpu},
                 {"end_without_begin", l.end_without_begin},
                 {"begin_without_end", l.begin_without_end},
                 {"io_inflight_overflow", l.io_inflight_overflow}};
  j["warnings"] = d.warnings;
  // Strings from the dump (argv, comm, attributes, notes, file names) may hold any bytes:
  // invalid UTF-8 is replaced by U+FFFD instead of aborting (the reader warns about it).
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace

std::span<const std::string_view> KvmExitCounterNames() {
  return kKvmExitCounters;
}

std::string RenderExitHealthTable(const Dump& dump, const ExitSummary& summary,
                                  const analysis::Diagnosis& diagnosis,
                                  const ExitHealthOptions& options) {
  return RenderTable(dump, summary, diagnosis, options);
}

analysis::DiagnosisOptions DumpDiagnosisOptions(const analysis::SummaryFilter& filter) {
  analysis::DiagnosisOptions o;
  o.slow = analysis::kDumpSlowRule;
  o.key = [filter, text = std::string()](const ExitEvent& e, std::string_view* key) mutable {
    if (filter.vcpu && e.vcpu != *filter.vcpu) return false;
    // As the summary filters: "unassigned" is every exit without a device.
    if (filter.device &&
        (*filter.device == "unassigned" ? !e.device.empty() : e.device != *filter.device))
      return false;
    text = analysis::DiagnosisCause(e);
    *key = text;
    return true;
  };
  return o;
}

DiagnosisTextOptions DumpDiagnosisText(const Dump& dump, const ExitHealthOptions& options) {
  DiagnosisTextOptions t;
  t.slow_rule = fmt::format("the recorder's threshold ({}) or seen stuck by the watchdog",
                            FormatDurationNs(dump.slow_exit_threshold_ns));
  t.lost_meaning = "time inside exits as the VMM timed them, HLT apart (idle)";
  t.events_command = options.events_command;
  return t;
}

std::string ExitHealthReport(const Dump& dump, const ExitHealthOptions& options) {
  analysis::DiagnosisBuilder diag(DumpDiagnosisOptions(options.filter));
  const ExitSummary s = analysis::Summarize(dump, options.filter, &diag);
  const analysis::Diagnosis d = diag.Finish();
  return options.format == OutputFormat::kJson ? RenderJson(dump, s, d, options)
                                               : RenderTable(dump, s, d, options);
}

void WriteExitHealthReport(const Dump& dump, const ExitHealthOptions& options, std::FILE* out) {
  const std::string s = ExitHealthReport(dump, options);
  std::fwrite(s.data(), 1, s.size(), out);
  std::fflush(out);
}

}  // namespace exitscope::report
