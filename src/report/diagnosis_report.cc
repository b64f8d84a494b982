// report/diagnosis_report.cc: the diagnosis in words, JSON and the top of every report.
#include "report/diagnosis_report.h"

#include <fmt/format.h>

#include <algorithm>

#include "report/format.h"

namespace exitscope::report {
namespace {

using analysis::Diagnosis;
using analysis::DiagnosisEvidence;
using analysis::DiagnosisGroup;
using analysis::DiagnosisVcpu;

std::string ShareText(double share) {
  return fmt::format("{:.1f} %", share * 100.0);
}

std::string VcpuName(const DiagnosisVcpu& v, bool with_vm) {
  return with_vm ? fmt::format("VM {} vCPU {}", v.vm, v.vcpu) : fmt::format("vCPU {}", v.vcpu);
}

bool SeveralVms(const Diagnosis& d) {
  for (const DiagnosisVcpu& v : d.vcpus)
    if (v.vm != d.vcpus.front().vm) return true;
  return false;
}

std::string Vcpus(const std::vector<uint32_t>& v) {
  if (v.empty()) return "";
  std::string s = v.size() == 1 ? "vCPU " : "vCPUs ";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i == 8) {
      s += fmt::format(" and {} more", v.size() - i);
      break;
    }
    s += fmt::format("{}{}", i ? "," : "", v[i]);
  }
  return s;
}

std::string Kind(const DiagnosisGroup& g) {
  if (g.open) return ", still inside at the end";
  if (g.slow) return ", slow";
  if (g.in_kernel) return ", in the kernel";
  return "";
}

// The device of a cause, for its "next" line: "nvme0" of "nvme0.SQ1TDBL write", "" for a
// cause without one ("HLT", "0x3f8:POUT", "unassigned 0xdead0000 read").
std::string DeviceOf(const DiagnosisGroup& g) {
  for (const DiagnosisEvidence& e : g.evidence)
    if (!e.device.empty()) return e.device;
  const size_t dot = g.cause.find('.');
  const size_t space = g.cause.find(' ');
  if (dot == std::string::npos || (space != std::string::npos && space < dot)) return "";
  return g.cause.substr(0, dot);
}

// What a stack capture says in the headline: "blocked in read from Wait (blk.cc:120)".
std::string StackClause(const DiagnosisEvidence& e) {
  return fmt::format("blocked in {}{}", e.call.empty() ? "?" : e.call,
                     e.frame.empty() ? "" : " from " + e.frame);
}

// The clause the headline gives a cause's strongest evidence, and the stuck thread's blocking
// call where a stack was captured.
std::string HeadlineEvidence(const DiagnosisGroup& g) {
  if (g.evidence.empty()) return "";
  const DiagnosisEvidence& e = g.evidence.front();
  const bool all = e.exits == g.count;
  const std::string each = g.count == 1 ? "" : all ? " each" : fmt::format(" {} of them", e.exits);
  std::string stack;
  for (const DiagnosisEvidence& x : g.evidence)
    if (x.kind == "stack" && &x != &e) stack = "; the thread " + StackClause(x);
  if (e.kind == "io-in-flight")
    return fmt::format(",{} with an {} I/O in flight{}", each, e.device, stack);
  if (e.kind == "stack") return ", " + StackClause(e);
  if (e.kind == "queue-full")
    return fmt::format(",{} with {}'s queue full{}", each, e.device, stack);
  if (e.kind == "off-cpu") return ", the vCPU thread blocked off the CPU for most of it";
  if (e.kind == "preempted") return ", the vCPU thread preempted for most of it";
  if (e.kind == "kernel-before") return ", most of it in the host kernel before the handler";
  if (e.kind == "kernel-after") return ", most of it in the host kernel after the handler";
  if (e.kind == "handler") return ", most of it in the VMM's handler";
  if (e.kind == "stuck") return ", the watchdog saw them stuck" + stack;
  if (e.kind == "open") return ", still inside when the recording ended" + stack;
  if (e.kind == "in-kernel") return ", handled in the kernel";
  if (e.kind == "in-vmm") return ", inside the VMM";
  return "";
}

std::string AllWell(const Diagnosis& d) {
  uint64_t in = 0, lost = 0;
  for (const DiagnosisVcpu& v : d.vcpus) {
    in += v.in_exits_ns;
    lost += v.lost_ns;
  }
  const double vt = static_cast<double>(d.span_ns) * static_cast<double>(d.vcpus.size());
  return fmt::format(
      "all well: {} exits{}, none slow, none stuck; the vCPUs spent {} of the run inside exits "
      "({} not counting HLT)",
      d.exits, d.timed ? fmt::format(" over {:.3f} s", d.span_ns / 1e9) : "",
      vt > 0 ? ShareText(std::min(1.0, in / vt)) : "-",
      vt > 0 ? ShareText(std::min(1.0, lost / vt)) : "-");
}

}  // namespace

std::string EvidenceText(const DiagnosisEvidence& e, uint64_t n) {
  const std::string of = fmt::format("{} of {}", e.exits, n);
  if (e.kind == "io-in-flight")
    return fmt::format("an {} I/O in flight through {} (typical age at the exit's end {})",
                       e.device, of, FormatDuration(e.ns));
  if (e.kind == "queue-full") return fmt::format("{}'s queue full during {}", e.device, of);
  if (e.kind == "stack") {
    std::string s = fmt::format("the stuck thread's stack ({}", of);
    if (e.state != 0) s += fmt::format(", state {}", StackStateText(e.state));
    s += "): ";
    s += e.call.empty() ? "in" : "blocked in " + e.call;
    if (!e.kernel.empty()) s += fmt::format(" (kernel {})", e.kernel);
    if (!e.frame.empty()) s += " from " + e.frame;
    return s;
  }
  if (e.kind == "stuck") return fmt::format("the watchdog saw {} stuck", of);
  if (e.kind == "open") return fmt::format("{} still inside when the recording ended", of);
  if (e.kind == "in-kernel") return "handled in the kernel: the VMM never saw them";
  if (e.kind == "in-vmm")
    return fmt::format(
        "{} reached the VMM: its handler held the vCPU (a recorder dump, the joint view or "
        "--stacks says what it did)",
        of);
  const std::string t = FormatDuration(e.ns);
  if (e.kind == "off-cpu") return fmt::format("vCPU thread blocked off the CPU: {} ({})", t, of);
  if (e.kind == "preempted")
    return fmt::format("vCPU thread preempted, waiting for a host CPU: {} ({})", t, of);
  if (e.kind == "handler") return fmt::format("in the VMM's handler, on the CPU: {}", t);
  if (e.kind == "kernel-before") return fmt::format("in the host kernel before the handler: {}", t);
  if (e.kind == "kernel-after") return fmt::format("in the host kernel after the handler: {}", t);
  return e.kind;
}

std::string NextStep(const DiagnosisGroup& g, const DiagnosisTextOptions& o) {
  if (o.events_command.empty()) return o.next_hint;
  const std::string dev = DeviceOf(g);
  return dev.empty() ? o.events_command : fmt::format("{} --device {}", o.events_command, dev);
}

std::string DiagnosisHeadline(const Diagnosis& d, const DiagnosisTextOptions&) {
  if (d.exits == 0) return "no exits recorded";
  if (d.all_well()) return AllWell(d);
  // Who lost what.
  // The vCPUs that lost something worth a word (0.1 % of the run or more).
  std::vector<const DiagnosisVcpu*> vs;
  for (const DiagnosisVcpu& v : d.vcpus)
    if (v.share >= 0.001) vs.push_back(&v);
  if (vs.empty())
    for (const DiagnosisVcpu& v : d.vcpus) vs.push_back(&v);
  std::stable_sort(vs.begin(), vs.end(), [](const DiagnosisVcpu* a, const DiagnosisVcpu* b) {
    return a->share > b->share;
  });
  const bool vm = SeveralVms(d);
  std::string who;
  const size_t shown = std::min<size_t>(vs.size(), 4);
  for (size_t i = 0; i < shown; ++i) {
    who += i == 0 ? "" : (i + 1 == shown && vs.size() == shown ? " and " : ", ");
    who += fmt::format("{} lost {}", VcpuName(*vs[i], vm), ShareText(vs[i]->share));
  }
  if (vs.size() > shown) who += fmt::format(" (and {} more vCPUs)", vs.size() - shown);
  // To what: the first slow or open cause, with the causes ranked next to it that share its
  // strongest evidence (both SQ doorbells waiting on one device's I/O).
  const DiagnosisGroup* top = nullptr;
  for (const DiagnosisGroup& g : d.groups)
    if (g.slow || (g.open && g.lost_ns != 0)) {
      top = &g;
      break;
    }
  if (top == nullptr) {  // open exits of unknown length only: say so, after the largest cause
    std::string s = who + " of the run";
    if (!d.groups.empty() && d.groups.front().lost_ns != 0)
      s += fmt::format(", the largest part to {} {} exits (typical {}, worst {})",
                       d.groups.front().count, d.groups.front().cause,
                       FormatDuration(d.groups.front().typical_ns),
                       FormatDuration(d.groups.front().worst_ns));
    if (d.open_exits != 0)
      s += fmt::format("; {} exit{} still inside when the recording ended", d.open_exits,
                       d.open_exits == 1 ? "" : "s");
    return s;
  }
  std::string causes = top->cause;
  uint64_t count = top->count, lost = top->lost_ns, lost_all = 0;
  for (const DiagnosisGroup& g : d.groups) lost_all += g.lost_ns;
  for (const DiagnosisGroup& g : d.groups) {
    if (&g == top || !(g.slow || g.open) || g.open != top->open) continue;
    const bool same = !g.evidence.empty() && !top->evidence.empty() &&
                      g.evidence.front().kind == top->evidence.front().kind &&
                      g.evidence.front().device == top->evidence.front().device;
    if (!same) continue;
    causes += " / " + g.cause;
    count += g.count;
    lost += g.lost_ns;
  }
  const char* most = lost_all > 0 && lost * 2 > lost_all ? "most of it" : "the largest part";
  const std::string size = top->open ? "still inside at the end"
                                     : fmt::format("of ~{}", FormatDuration(top->typical_ns));
  return fmt::format("{} of the run, {} to {} {} {} exit{} {}{}", who, most, count,
                     top->open ? "open" : "slow", causes, count == 1 ? "" : "s", size,
                     HeadlineEvidence(*top));
}

std::string DiagnosisText(const Diagnosis& d, const DiagnosisTextOptions& o) {
  std::string out = fmt::format("Diagnosis: {}\n", DiagnosisHeadline(d, o));
  if (!o.seen_from_kernel.empty()) out += fmt::format("  {}\n", o.seen_from_kernel);
  if (d.exits == 0 || d.all_well()) return out + "\n";
  const bool vm = SeveralVms(d);
  out += fmt::format("  run {}{} vCPU{}, {} exits",
                     d.timed ? fmt::format("{:.3f} s, ", d.span_ns / 1e9) : "", d.vcpus.size(),
                     d.vcpus.size() == 1 ? "" : "s", d.exits);
  if (!o.slow_rule.empty()) out += fmt::format("; slow: {}", o.slow_rule);
  out += "\n";
  if (!o.lost_meaning.empty()) out += fmt::format("  lost: {}\n", o.lost_meaning);
  constexpr size_t kMaxVcpus = 8;
  for (size_t i = 0; i < d.vcpus.size() && i < kMaxVcpus; ++i) {
    const DiagnosisVcpu& v = d.vcpus[i];
    out += fmt::format("  {:<7} lost {} ({})", VcpuName(v, vm), FormatDuration(v.lost_ns),
                       d.span_ns ? ShareText(v.share) : "-");
    if (v.slow_ns)
      out += fmt::format(", {} of it in slow or stuck exits", FormatDuration(v.slow_ns));
    if (v.idle_ns) out += fmt::format("; idle in HLT {}", FormatDuration(v.idle_ns));
    if (v.off_cpu_ns) out += fmt::format("; off the CPU {}", FormatDuration(v.off_cpu_ns));
    out += "\n";
  }
  if (d.vcpus.size() > kMaxVcpus)
    out += fmt::format("  ... {} more vCPUs (--format json lists every one)\n",
                       d.vcpus.size() - kMaxVcpus);
  out += "\n  What took the time, largest first\n";
  size_t n = 0;
  uint64_t rest_count = 0, rest_ns = 0;
  double rest_share = 0;
  size_t rest = 0;
  for (const DiagnosisGroup& g : d.groups) {
    if (n == o.max_groups || (n > 0 && !g.slow && !g.open && g.share < 0.01)) {
      ++rest;
      rest_count += g.count;
      rest_ns += g.lost_ns;
      rest_share += g.share;
      continue;
    }
    ++n;
    out += fmt::format("  {:>2}. {}{}: {} exit{}, {}{}, {}\n", n, g.cause, Kind(g), g.count,
                       g.count == 1 ? "" : "s", FormatDuration(g.lost_ns),
                       d.span_ns ? fmt::format(" ({} of the run)", ShareText(g.share)) : "",
                       Vcpus(g.vcpus));
    if (g.typical_ns || g.worst_ns) {
      out += fmt::format("      typical {}, p90 {}, worst {}", FormatDuration(g.typical_ns),
                         FormatDuration(g.p90_ns), FormatDuration(g.worst_ns));
      if (d.timed)
        out += fmt::format("; first +{:.3f} s, last +{:.3f} s", g.first_ns / 1e9, g.last_ns / 1e9);
      out += "\n";
    }
    for (const DiagnosisEvidence& e : g.evidence)
      out += fmt::format("      evidence: {}\n", EvidenceText(e, g.count));
    if ((g.slow || g.open) && !NextStep(g, o).empty())
      out += fmt::format("      next: {}\n", NextStep(g, o));
  }
  if (rest != 0)
    out += fmt::format("  ... {} more cause{}: {} exits, {}{}\n", rest, rest == 1 ? "" : "s",
                       rest_count, FormatDuration(rest_ns),
                       d.span_ns ? fmt::format(" ({} of the run)", ShareText(rest_share)) : "");
  if (d.evidence_dropped)
    out += fmt::format(
        "  ({} exits, I/Os or captures beyond the evidence bounds went without evidence)\n",
        d.evidence_dropped);
  return out + "\n";
}

nlohmann::json DiagnosisJson(const Diagnosis& d, const DiagnosisTextOptions& o) {
  using nlohmann::json;
  const auto group = [&](const DiagnosisGroup& g, size_t rank) {
    json ev = json::array();
    for (const DiagnosisEvidence& e : g.evidence) {
      json x = {
          {"kind", e.kind}, {"exits", e.exits}, {"ns", e.ns}, {"text", EvidenceText(e, g.count)}};
      if (!e.device.empty()) x["device"] = e.device;
      if (e.kind == "stack") {
        x["call"] = e.call;
        x["frame"] = e.frame;
        x["kernel"] = e.kernel;
        x["state"] = StackStateText(e.state);
      }
      ev.push_back(std::move(x));
    }
    json j = {{"rank", rank},
              {"cause", g.cause},
              {"slow", g.slow},
              {"open", g.open},
              {"in_kernel", g.in_kernel},
              {"idle", g.idle},
              {"count", g.count},
              {"lost_ns", g.lost_ns},
              {"share", g.share},
              {"typical_ns", g.typical_ns},
              {"p90_ns", g.p90_ns},
              {"worst_ns", g.worst_ns},
              {"vcpus", g.vcpus},
              {"evidence", std::move(ev)},
              {"next", NextStep(g, o)}};
    if (d.timed) {
      j["first_ns"] = g.first_ns;
      j["last_ns"] = g.last_ns;
    }
    return j;
  };
  json vcpus = json::array();
  for (const DiagnosisVcpu& v : d.vcpus)
    vcpus.push_back({{"vm", v.vm},
                     {"vcpu", v.vcpu},
                     {"exits", v.exits},
                     {"in_exits_ns", v.in_exits_ns},
                     {"idle_ns", v.idle_ns},
                     {"lost_ns", v.lost_ns},
                     {"slow_ns", v.slow_ns},
                     {"off_cpu_ns", v.off_cpu_ns},
                     {"share", v.share}});
  json causes = json::array(), idle = json::array();
  for (size_t i = 0; i < d.groups.size(); ++i) causes.push_back(group(d.groups[i], i + 1));
  for (size_t i = 0; i < d.idle.size(); ++i) idle.push_back(group(d.idle[i], i + 1));
  return {{"schema", "exitscope.diagnosis.v1"},
          {"headline", DiagnosisHeadline(d, o)},
          {"all_well", d.all_well()},
          {"span_ns", d.span_ns},
          {"timed", d.timed},
          {"exits", d.exits},
          {"slow_exits", d.slow_exits},
          {"open_exits", d.open_exits},
          {"slow_rule", o.slow_rule},
          {"lost_meaning", o.lost_meaning},
          {"vcpus", std::move(vcpus)},
          {"causes", std::move(causes)},
          {"idle", std::move(idle)},
          {"evidence_dropped", d.evidence_dropped}};
}

}  // namespace exitscope::report
