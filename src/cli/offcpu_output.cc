// cli/offcpu_output.cc: the live lines of `--stacks` (offcpu_output.h).
#include "cli/offcpu_output.h"

#include "report/offcpu_report.h"

namespace exitscope::cli {

using analysis::OffCpuSlowExit;
using sources::bpf::OffCpuExit;
using sources::bpf::OffCpuSymbolizer;

std::string OffCpuLive(const OffCpuSlowExit& e, bool json) {
  if (!json) return report::OffCpuExitText(e, e.stuck ? "Stuck now" : "Slow exit");
  return nlohmann::json{{e.stuck ? "stuck" : "slow_exit", report::OffCpuExitJson(e)}}.dump(
             -1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

Result<std::vector<OffCpuSlowExit>> TakeOffCpuEnded(sources::bpf::BpfOffCpuStacks& s,
                                                    OffCpuSymbolizer& sym) {
  auto ended = s.TakeEnded();
  if (!ended) return Propagate(ended);
  std::vector<OffCpuSlowExit> out;
  for (const OffCpuExit& e : *ended) out.push_back(analysis::SymbolizeOffCpuExit(e, sym, false));
  return out;
}

Result<std::vector<std::string>> OffCpuEnded(sources::bpf::BpfOffCpuStacks& s,
                                             OffCpuSymbolizer& sym, bool json,
                                             analysis::OffCpuSlowExits* kept) {
  auto ended = TakeOffCpuEnded(s, sym);
  if (!ended) return Propagate(ended);
  std::vector<std::string> out;
  for (OffCpuSlowExit& x : *ended) {
    out.push_back(OffCpuLive(x, json));
    if (kept != nullptr) kept->Add(std::move(x));
  }
  return out;
}

Result<std::vector<OffCpuSlowExit>> OffCpuStuckNow(const sources::bpf::BpfOffCpuStacks& s,
                                                   OffCpuSymbolizer& sym, uint64_t slow_ns) {
  auto now = s.InFlight();
  if (!now) return Propagate(now);
  std::vector<OffCpuSlowExit> out;
  for (const OffCpuExit& e : *now) {
    if (e.duration_ns() >= slow_ns) out.push_back(analysis::SymbolizeOffCpuExit(e, sym, true));
  }
  return out;
}

Result<std::string> OffCpuStuck(const sources::bpf::BpfOffCpuStacks& s, OffCpuSymbolizer& sym,
                                bool json, uint64_t slow_ns) {
  auto now = OffCpuStuckNow(s, sym, slow_ns);
  if (!now) return Propagate(now);
  std::string out;
  for (const OffCpuSlowExit& e : *now) out += OffCpuLive(e, json);
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
