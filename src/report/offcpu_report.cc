// report/offcpu_report.cc: text and JSON of the kernel-seen slow exits (offcpu_report.h).
#include "report/offcpu_report.h"

#include <fmt/format.h>

namespace exitscope::report {
namespace {

using analysis::OffCpuSlowExit;
using sources::bpf::OffCpuSite;

double Ms(uint64_t ns) {
  return static_cast<double>(ns) / 1e6;
}

nlohmann::json FrameJson(const StackFrame& f) {
  nlohmann::json j{{"ip", f.ip}, {"text", FormatFrame(f)}};
  if (!f.function.empty()) {
    j["function"] = f.function;
    j["offset"] = f.offset;
  } else {
    j["unresolved"] = true;
  }
  if (!f.module.empty()) j["module"] = f.module;
  if (!f.file.empty()) j["file"] = f.file;
  if (f.line != 0) j["line"] = f.line;
  return j;
}

std::string How(const OffCpuSite& s) {
  return s.preempted == s.switches ? "preempted"
         : s.preempted == 0        ? "blocked"
                                   : "blocked or preempted";
}

}  // namespace

std::string OffCpuExitText(const OffCpuSlowExit& x, std::string_view title) {
  const sources::bpf::OffCpuExit& e = x.exit;
  std::string out = fmt::format(
      "{}: tid {} (pid {}) inside {:.3f} ms ({}), off the CPU {:.3f} ms in {} switch{}{}\n", title,
      e.tid, e.tgid, Ms(x.inside_ns()), analysis::OffCpuKindText(e.kind), Ms(e.off_ns), e.switches,
      e.switches == 1 ? "" : "es",
      e.stack_drops == 0 ? "" : fmt::format(", {} stacks not stored", e.stack_drops));
  for (size_t i = 0; i < e.sites.size() && i < x.stacks.size(); ++i) {
    const OffCpuSite& s = e.sites[i];
    const ThreadStack& st = x.stacks[i];
    out += fmt::format("  {:.3f} ms off the CPU, {} switch{}, {}{}:\n", Ms(s.off_ns), s.switches,
                       s.switches == 1 ? "" : "es", How(s),
                       s.in_progress ? ", still off the CPU there now" : "");
    const char* label = "kernel";
    for (const StackFrame& f : st.kernel) {
      out += fmt::format("    {:<6}  {}\n", label, FormatFrame(f));
      label = "";
    }
    label = "user";
    for (const StackFrame& f : st.user) {
      out += fmt::format("    {:<6}  {}\n", label, FormatFrame(f));
      label = "";
    }
    if (!st.note.empty()) out += fmt::format("    ({})\n", st.note);
  }
  if (e.other_switches != 0) {
    out += fmt::format(
        "  {:.3f} ms off the CPU in {} more switches (stacks beyond the {} kept per exit)\n",
        Ms(e.other_off_ns), e.other_switches, OS_SITES);
  }
  return out;
}

nlohmann::json OffCpuExitJson(const OffCpuSlowExit& x) {
  const sources::bpf::OffCpuExit& e = x.exit;
  nlohmann::json sites = nlohmann::json::array();
  for (size_t i = 0; i < e.sites.size() && i < x.stacks.size(); ++i) {
    const OffCpuSite& s = e.sites[i];
    const ThreadStack& st = x.stacks[i];
    nlohmann::json k = nlohmann::json::array(), u = nlohmann::json::array();
    for (const StackFrame& f : st.kernel) k.push_back(FrameJson(f));
    for (const StackFrame& f : st.user) u.push_back(FrameJson(f));
    nlohmann::json js{{"off_cpu_ns", s.off_ns},   {"switches", s.switches},
                      {"preempted", s.preempted}, {"in_progress", s.in_progress},
                      {"kernel", std::move(k)},   {"user", std::move(u)}};
    if (!st.note.empty()) js["note"] = st.note;
    sites.push_back(std::move(js));
  }
  nlohmann::json j{{"tid", e.tid},
                   {"pid", e.tgid},
                   {"kind", analysis::OffCpuKindText(e.kind)},
                   {"stuck", x.stuck},
                   {"start_ns", e.start_ns},
                   {"inside_ns", x.inside_ns()},
                   {"off_cpu_ns", e.off_ns},
                   {"switches", e.switches},
                   {"stack_drops", e.stack_drops},
                   {"other_off_cpu_ns", e.other_off_ns},
                   {"other_switches", e.other_switches},
                   {"sites", std::move(sites)}};
  if (e.end_ns != 0) j["end_ns"] = e.end_ns;
  return j;
}

std::string OffCpuExitHeadline(const OffCpuSlowExit& x) {
  std::string s = fmt::format("inside {:.3f} ms{}", Ms(x.inside_ns()), x.stuck ? " (stuck)" : "");
  if (x.exit.sites.empty() || x.stacks.empty()) return s + ", no stack kept";
  const StackFrame* k = analysis::BlockingKernelFrame(x.stacks.front());
  const StackFrame* u = analysis::OwnUserFrame(x.stacks.front());
  s += fmt::format(", {} {:.3f} ms", How(x.exit.sites.front()), Ms(x.exit.sites.front().off_ns));
  if (k != nullptr) s += fmt::format(" in {}", k->function);
  if (u != nullptr) s += fmt::format(", from {}", FormatFrame(*u));
  return s;
}

std::string OffCpuSectionText(const analysis::OffCpuSlowExits& s, size_t max_text) {
  const auto& o = s.options();
  std::string out = fmt::format(
      "\nSlow exits seen from the kernel, with their stacks ({} ms or longer, kvm stat --bpf "
      "--stacks): {}",
      Ms(o.slow_ns), s.seen());
  if (s.seen() == 0) return out + "\n";
  out += fmt::format(", slowest first{}\n",
                     s.left_out() != 0 ? fmt::format(" (the {} slowest kept, {} more counted)",
                                                     s.exits().size(), s.left_out())
                                       : "");
  size_t n = 0;
  for (const OffCpuSlowExit& e : s.exits()) {
    if (n++ == max_text) {
      out += fmt::format("  ... {} more kept (--format json or html lists them)\n",
                         s.exits().size() - max_text);
      break;
    }
    out += OffCpuExitText(e, e.stuck ? "Stuck at the end" : "Slow exit");
  }
  for (const std::string& note : s.notes()) out += "note: " + note + "\n";
  return out;
}

std::string OffCpuDiagnosisLine(const analysis::OffCpuSlowExits& s) {
  if (s.exits().empty()) return "";
  const OffCpuSlowExit& e = s.exits().front();
  return fmt::format("slowest exit seen from the kernel: tid {} (pid {}) {}", e.exit.tid,
                     e.exit.tgid, OffCpuExitHeadline(e));
}

}  // namespace exitscope::report
