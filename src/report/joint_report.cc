#include "report/joint_report.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "report/format.h"

namespace exitscope::report {
namespace {

using analysis::JointExit;
using analysis::JointGroup;
using analysis::JointPart;
using analysis::JointUnmatched;
using analysis::JointView;

constexpr const char* kNotSplit =
    "the trace has no sched:sched_switch records, so time with the vCPU thread not running is "
    "not split out: it is inside the parts (record with `exitscope kvm record -e 'kvm:*' -e "
    "sched:sched_switch` to split it)";

std::string UsText(uint64_t ns) {
  return FormatUsec(ns);
}

std::string WholePercent(double share) {
  return fmt::format("{:.0f}%", share * 100);
}

// Unmatched exits counted by reason, most frequent first.
std::vector<std::pair<std::string, uint64_t>> ByReason(const std::vector<JointUnmatched>& u) {
  std::map<std::string, uint64_t> m;
  for (const JointUnmatched& x : u) ++m[x.reason];
  std::vector<std::pair<std::string, uint64_t>> out(m.begin(), m.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::string MappingLine(const JointView& v) {
  std::string s;
  for (const analysis::JointVcpuThread& t : v.threads) {
    s += fmt::format("{}vcpu {} = tid {}", s.empty() ? "" : ", ", t.vcpu, t.tid);
  }
  if (v.mapping == analysis::JointMapping::kThreadId) {
    s += " (the dump's thread ids";
    const bool all_known =
        std::all_of(v.threads.begin(), v.threads.end(), [](const auto& t) { return t.votes == 0; });
    s += all_known ? ")" : "; vCPUs with a vote count: by time)";
  } else if (v.mapping == analysis::JointMapping::kThreadByTime) {
    s += " (the dump has no thread ids: each vCPU is the thread whose kernel exits contain its "
         "exits)";
  } else {
    s += " (no exit nested: the kernel source's vCPU index)";
  }
  return s;
}

std::string ExitName(const JointExit& j) {
  std::string s = j.kind;
  if (!j.device.empty()) s += " " + j.device + (j.reg.empty() ? "" : "." + j.reg);
  if (!j.dir.empty()) s += " " + j.dir;
  return s;
}

void AppendGroups(std::string& out, const char* title, const std::vector<JointGroup>& groups,
                  size_t rows, bool sched) {
  out += fmt::format("\n{}\n", title);
  out += fmt::format("  {:<34} {:>6}  {:>17}  {:>17}  {:>18}  {:>17}  {}{:>13}\n", "", "count",
                     "kernel us p50/p99", "before us p50/p99", "handler us p50/p99",
                     "after us p50/p99", sched ? fmt::format("{:>17}  ", "off-cpu us p50/p99") : "",
                     "handler share");
  size_t n = 0;
  for (const JointGroup& g : groups) {
    if (rows != 0 && n++ == rows) {
      out += fmt::format("  ... {} more rows (--rows 0 lists all)\n", groups.size() - rows);
      break;
    }
    const auto pair = [](const JointPart& p) {
      return fmt::format("{:>8}/{:<8}", UsText(p.p50_ns), UsText(p.p99_ns));
    };
    out += fmt::format("  {:<34} {:>6}  {}  {}  {} {}  {}{:>5}/{:<7}\n", g.key, g.count,
                       pair(g.total), pair(g.before), pair(g.handler), pair(g.after),
                       sched ? pair(g.off_cpu) + "  " : "", WholePercent(g.handler.share_p50),
                       WholePercent(g.handler.share_p99));
  }
}

nlohmann::json PartJson(const JointPart& p) {
  return {{"p50_ns", p.p50_ns},
          {"p99_ns", p.p99_ns},
          {"share_p50", p.share_p50},
          {"share_p99", p.share_p99}};
}

nlohmann::json JointGroupsJson(const std::vector<JointGroup>& groups, bool sched) {
  nlohmann::json arr = nlohmann::json::array();
  for (const JointGroup& g : groups) {
    nlohmann::json row = {{"key", g.key},
                          {"count", g.count},
                          {"kernel", PartJson(g.total)},
                          {"kernel_before", PartJson(g.before)},
                          {"handler", PartJson(g.handler)},
                          {"kernel_after", PartJson(g.after)}};
    if (sched) row["off_cpu"] = PartJson(g.off_cpu);
    arr.push_back(std::move(row));
  }
  return arr;
}

nlohmann::json ExitJson(const JointExit& j, bool sched) {
  nlohmann::json e = {{"vcpu", j.vcpu},
                      {"tid", j.tid},
                      {"kind", j.kind},
                      {"device", j.device},
                      {"register", j.reg},
                      {"dir", j.dir},
                      {"kernel_reason", j.kernel_reason},
                      {"kernel_start_ns", j.kernel_start_ns},
                      {"handler_start_ns", j.handler_start_ns},
                      {"offset_ns", j.offset_ns},
                      {"kernel_ns", j.kernel_ns},
                      {"kernel_before_ns", j.before_ns},
                      {"handler_ns", j.handler_ns},
                      {"kernel_after_ns", j.after_ns}};
  if (sched) {
    e["off_cpu_ns"] = j.off_cpu_ns;
    e["off_cpu_runnable_ns"] = j.off_cpu_runnable_ns;
    e["handler_wall_ns"] = j.handler_wall_ns;
  }
  return e;
}

nlohmann::json UnmatchedJson(const std::vector<JointUnmatched>& u) {
  nlohmann::json reasons = nlohmann::json::array();
  for (const auto& [reason, n] : ByReason(u)) reasons.push_back({{"reason", reason}, {"count", n}});
  nlohmann::json exits = nlohmann::json::array();
  for (const JointUnmatched& x : u) {
    exits.push_back({{"vcpu", x.vcpu},
                     {"tid", x.tid},
                     {"start_ns", x.start_ns},
                     {"duration_ns", x.duration_ns},
                     {"what", x.what},
                     {"reason", x.reason}});
  }
  return {{"count", u.size()}, {"reasons", std::move(reasons)}, {"exits", std::move(exits)}};
}

}  // namespace

std::string RenderJointTable(const JointView& v, const JointRenderOptions& o) {
  std::string out;
  out += fmt::format("Joint view: {} (VMM) + {} (kernel, {})\n", o.dump, o.trace,
                     v.trace_format.empty() ? "trace" : v.trace_format);
  out += fmt::format(
      "  clock     trace x86-tsc ticks converted with the dump's TSC calibration ({:.3f} MHz): "
      "the same host's TSC (--tsc-mhz is not used)\n",
      static_cast<double>(v.tsc_hz) / 1e6);
  out += fmt::format("  threads   {}\n", MappingLine(v));
  out += fmt::format("  matched   {} exits: {} of {} VMM exits, {} of {} kernel userspace exits\n",
                     v.matched.size(), v.matched.size(), v.vmm_exits, v.matched.size(),
                     v.kernel_exits);
  out += fmt::format(
      "  offset    handler start - kernel exit start: min {} us, median {} us, max {} us\n",
      fmt::format("{:.2f}", static_cast<double>(v.offset.min_ns) / 1e3),
      fmt::format("{:.2f}", static_cast<double>(v.offset.median_ns) / 1e3),
      fmt::format("{:.2f}", static_cast<double>(v.offset.max_ns) / 1e3));
  for (const std::string& w : v.warnings) out += fmt::format("  warning   {}\n", w);
  const bool sched = v.sched_recorded;
  if (sched) {
    out += fmt::format(
        "  split     kernel = before (exit -> handler start) + handler (VMM) + after (handler "
        "end -> guest entry) + off-cpu (vCPU thread switched out, from {} sched_switch "
        "records; the other parts are on-CPU time)\n",
        v.sched_switches);
  } else {
    out += fmt::format(
        "  split     kernel = before (exit -> handler start) + handler (VMM) + "
        "after (handler end -> guest entry)\n");
    out += fmt::format("  note      {}\n", kNotSplit);
  }

  out += "\n" + DiagnosisText(analysis::DiagnoseJoint(v, o.slow_ns), JointDiagnosisText(o));
  const analysis::JointGroups g = analysis::GroupJointExits(v.matched);
  AppendGroups(out, "By kind", g.by_kind, o.rows, sched);
  AppendGroups(out, "By device", g.by_device, o.rows, sched);
  AppendGroups(out, "By register", g.by_register, o.rows, sched);

  const std::vector<JointExit> slow = analysis::SlowestJointExits(v.matched, o.slow);
  out += fmt::format("\nSlowest {} exits (by kernel duration)\n", slow.size());
  out += fmt::format("  {:>10} {:>4} {:>7}  {:<30} {:>10} {:>10} {:>10} {:>10}{}\n", "kernel s",
                     "vcpu", "tid", "exit", "kernel us", "before us", "handler us", "after us",
                     sched ? fmt::format(" {:>10} {:>10}", "off-cpu us", "preempted") : "");
  for (const JointExit& j : slow) {
    out += fmt::format(
        "  {:>10.6f} {:>4} {:>7}  {:<30} {:>10} {:>10} {:>10} {:>10}{}\n",
        static_cast<double>(j.kernel_start_ns) / 1e9, j.vcpu, j.tid, ExitName(j),
        UsText(j.kernel_ns), UsText(j.before_ns), UsText(j.handler_ns), UsText(j.after_ns),
        sched ? fmt::format(" {:>10} {:>10}", UsText(j.off_cpu_ns), UsText(j.off_cpu_runnable_ns))
              : "");
  }

  const auto unmatched = [&](const char* side, const std::vector<JointUnmatched>& u) {
    out += fmt::format("\nUnmatched {} exits: {}\n", side, u.size());
    for (const auto& [reason, n] : ByReason(u)) out += fmt::format("  {:>6}  {}\n", n, reason);
    size_t shown = 0;
    for (const JointUnmatched& x : u) {
      if (shown++ == 10) {
        out += fmt::format("  ... {} more (--format json lists all)\n", u.size() - 10);
        break;
      }
      out += fmt::format("    {:.6f} s vcpu {} tid {}: {} ({}): {}\n",
                         static_cast<double>(x.start_ns) / 1e9, x.vcpu, x.tid, x.what,
                         x.duration_ns ? FormatDuration(x.duration_ns) : std::string("no end"),
                         x.reason);
    }
  };
  unmatched("VMM", v.unmatched_vmm);
  unmatched("kernel", v.unmatched_kernel);
  return out;
}

DiagnosisTextOptions JointDiagnosisText(const JointRenderOptions& o) {
  DiagnosisTextOptions t;
  t.slow_rule = o.slow_ns != 0
                    ? fmt::format("the kernel's exit time at least the dump's threshold ({})",
                                  FormatDuration(o.slow_ns))
                    : "none (the dump has no slow-exit threshold)";
  t.lost_meaning =
      "the kernel's time of each matched userspace exit (exit to guest entry), HLT apart";
  t.next_hint = "the slowest exits below; --format json lists every exit with its split";
  return t;
}

std::string RenderJointJson(const JointView& v, const JointRenderOptions& o) {
  nlohmann::json joint;
  joint["diagnosis"] = DiagnosisJson(analysis::DiagnoseJoint(v, o.slow_ns), JointDiagnosisText(o));
  joint["dump"] = o.dump;
  joint["trace"] = o.trace;
  joint["trace_format"] = v.trace_format;
  joint["clock"] = {{"trace_clock", "x86-tsc"},
                    {"tsc_hz", v.tsc_hz},
                    {"tsc_hz_from", "dump"},
                    {"timestamps", "CLOCK_MONOTONIC ns of the recording host"}};
  nlohmann::json threads = nlohmann::json::array();
  for (const analysis::JointVcpuThread& t : v.threads) {
    threads.push_back(
        {{"vcpu", t.vcpu}, {"tid", t.tid}, {"kernel_vcpu", t.kernel_vcpu}, {"votes", t.votes}});
  }
  joint["vcpu_threads"] = {{"method", std::string(analysis::ToString(v.mapping))},
                           {"threads", std::move(threads)}};
  joint["vmm_exits"] = v.vmm_exits;
  joint["kernel_exits"] = v.kernel_exits;
  joint["matched"] = v.matched.size();
  joint["unmatched_vmm"] = UnmatchedJson(v.unmatched_vmm);
  joint["unmatched_kernel"] = UnmatchedJson(v.unmatched_kernel);
  joint["offset_ns"] = {
      {"min", v.offset.min_ns}, {"median", v.offset.median_ns}, {"max", v.offset.max_ns}};
  joint["warnings"] = v.warnings;
  const bool sched = v.sched_recorded;
  joint["sched_recorded"] = sched;
  joint["sched_switches"] = v.sched_switches;
  if (!sched) joint["not_split"] = {{"not_running", kNotSplit}};
  const analysis::JointGroups g = analysis::GroupJointExits(v.matched);
  joint["by_kind"] = JointGroupsJson(g.by_kind, sched);
  joint["by_device"] = JointGroupsJson(g.by_device, sched);
  joint["by_register"] = JointGroupsJson(g.by_register, sched);
  nlohmann::json slow = nlohmann::json::array();
  for (const JointExit& j : analysis::SlowestJointExits(v.matched, o.slow)) {
    slow.push_back(ExitJson(j, sched));
  }
  joint["slow_exits"] = std::move(slow);
  nlohmann::json exits = nlohmann::json::array();
  size_t left_out = 0;
  for (const JointExit& j : v.matched) {
    if (o.max_exits != 0 && exits.size() >= o.max_exits) {
      ++left_out;
      continue;
    }
    exits.push_back(ExitJson(j, sched));
  }
  joint["exits"] = std::move(exits);
  joint["exits_left_out"] = left_out;
  nlohmann::json j;
  j["schema"] = "exitscope.joint.v1";
  j["joint"] = std::move(joint);
  // Names come from the inputs: never abort on bytes that are not UTF-8.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace exitscope::report
