// cli/offcpu_output.cc: the text and JSON of `--stacks` (offcpu_output.h).
#include "cli/offcpu_output.h"

#include <fmt/format.h>

namespace exitscope::cli {

namespace {

using sources::bpf::OffCpuExit;
using sources::bpf::OffCpuSite;
using sources::bpf::OffCpuSymbolizer;

std::string Kind(uint32_t kind) {
  std::string s;
  if (kind & OS_KIND_KERNEL) s += "kvm_exit";
  if (kind & OS_KIND_USERSPACE) s += s.empty() ? "userspace exit" : ", userspace exit";
  if (kind & OS_KIND_MARKED) s += s.empty() ? "marked" : ", marked";
  return s.empty() ? "exit" : s;
}

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

}  // namespace

std::string OffCpuExitText(const OffCpuExit& e, OffCpuSymbolizer& sym, std::string_view title) {
  std::string out = fmt::format(
      "{}: tid {} (pid {}) inside {:.3f} ms ({}), off the CPU {:.3f} ms in {} switch{}{}\n", title,
      e.tid, e.tgid, Ms(e.duration_ns()), Kind(e.kind), Ms(e.off_ns), e.switches,
      e.switches == 1 ? "" : "es",
      e.stack_drops == 0 ? "" : fmt::format(", {} stacks not stored", e.stack_drops));
  for (const OffCpuSite& s : e.sites) {
    const ThreadStack st = sym.Resolve(e.tgid, e.tid, s);
    out += fmt::format("  {:.3f} ms off the CPU, {} switch{}, {}{}:\n", Ms(s.off_ns), s.switches,
                       s.switches == 1 ? "" : "es",
                       s.preempted == s.switches ? "preempted"
                       : s.preempted == 0        ? "blocked"
                                                 : "blocked or preempted",
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
        "  {:.3f} ms off the CPU in {} more switches (stacks beyond the {} kept "
        "per exit)\n",
        Ms(e.other_off_ns), e.other_switches, OS_SITES);
  }
  return out;
}

nlohmann::json OffCpuExitJson(const OffCpuExit& e, OffCpuSymbolizer& sym, bool stuck) {
  nlohmann::json sites = nlohmann::json::array();
  for (const OffCpuSite& s : e.sites) {
    const ThreadStack st = sym.Resolve(e.tgid, e.tid, s);
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
                   {"kind", Kind(e.kind)},
                   {"start_ns", e.start_ns},
                   {"inside_ns", e.duration_ns()},
                   {"off_cpu_ns", e.off_ns},
                   {"switches", e.switches},
                   {"stack_drops", e.stack_drops},
                   {"other_off_cpu_ns", e.other_off_ns},
                   {"other_switches", e.other_switches},
                   {"sites", std::move(sites)}};
  if (e.end_ns != 0) j["end_ns"] = e.end_ns;
  return nlohmann::json{{stuck ? "stuck" : "slow_exit", std::move(j)}};
}

Result<std::vector<std::string>> OffCpuEnded(sources::bpf::BpfOffCpuStacks& s,
                                             OffCpuSymbolizer& sym, bool json) {
  auto ended = s.TakeEnded();
  if (!ended) return Propagate(ended);
  std::vector<std::string> out;
  for (const OffCpuExit& e : *ended) {
    out.push_back(json ? OffCpuExitJson(e, sym, false).dump() + "\n"
                       : OffCpuExitText(e, sym, "Slow exit"));
  }
  return out;
}

Result<std::string> OffCpuStuck(const sources::bpf::BpfOffCpuStacks& s, OffCpuSymbolizer& sym,
                                bool json, uint64_t slow_ns) {
  auto now = s.InFlight();
  if (!now) return Propagate(now);
  std::string out;
  for (const OffCpuExit& e : *now) {
    if (e.duration_ns() < slow_ns) continue;
    out += json ? OffCpuExitJson(e, sym, true).dump() + "\n" : OffCpuExitText(e, sym, "Stuck now");
  }
  return out;
}

std::string NewOffCpuNotes(const OffCpuSymbolizer& sym, size_t* printed) {
  std::string out;
  for (; *printed < sym.notes().size(); ++*printed) {
    out += "note: " + sym.notes()[*printed] + "\n";
  }
  return out;
}

}  // namespace exitscope::cli
