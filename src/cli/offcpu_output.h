// cli/offcpu_output.h: how `kvm stat --bpf --stacks` and `kvm live --stacks` print an exit's
// off-CPU stacks (sources/bpf/bpf_offcpu_stacks.h) while they run: slow exits when they end,
// exits still stuck in the in-flight view; as text (table format) or one JSON object a line
// (json format). The exits are symbolized into analysis/offcpu_exits.h's model and written by
// report/offcpu_report.h, the layout the final report's section shares.
//
// Frames are symbolized by OffCpuSymbolizer; each reason a frame could not be resolved is
// printed once per run ("note: ...").
#pragma once

#include <string>
#include <vector>

#include "analysis/offcpu_exits.h"
#include "exitscope/status.h"
#include "sources/bpf/bpf_offcpu_stacks.h"

namespace exitscope::cli {

// One exit as printed live: its text block ("Slow exit" / "Stuck now"), or one JSON line
// {"slow_exit": {...}} / {"stuck": {...}} (report/offcpu_report.h's object).
std::string OffCpuLive(const analysis::OffCpuSlowExit& e, bool json);
// The slow exits that ended since the last call, drained from `s`, symbolized.
Result<std::vector<analysis::OffCpuSlowExit>> TakeOffCpuEnded(sources::bpf::BpfOffCpuStacks& s,
                                                              sources::bpf::OffCpuSymbolizer& sym);
// The same printed: one text block (or one
// JSON line) each; each also added to `kept` when not null (the final report's).
Result<std::vector<std::string>> OffCpuEnded(sources::bpf::BpfOffCpuStacks& s,
                                             sources::bpf::OffCpuSymbolizer& sym, bool json,
                                             analysis::OffCpuSlowExits* kept = nullptr);
// The exits inside for `slow_ns` or more now, symbolized, marked stuck.
Result<std::vector<analysis::OffCpuSlowExit>> OffCpuStuckNow(const sources::bpf::BpfOffCpuStacks& s,
                                                             sources::bpf::OffCpuSymbolizer& sym,
                                                             uint64_t slow_ns);
// The same printed ("Stuck now", or {"stuck": ...} lines).
Result<std::string> OffCpuStuck(const sources::bpf::BpfOffCpuStacks& s,
                                sources::bpf::OffCpuSymbolizer& sym, bool json, uint64_t slow_ns);
// The symbolizer's notes not printed yet, "note: ...\n" each (`*printed`: how many were).
std::string NewOffCpuNotes(const sources::bpf::OffCpuSymbolizer& sym, size_t* printed);

}  // namespace exitscope::cli
