// cli/offcpu_output.h: how `kvm stat --bpf --stacks` prints an exit's off-CPU stacks
// (sources/bpf/bpf_offcpu_stacks.h): slow exits when they end, exits still stuck in the
// in-flight view; as text (table format) or one JSON object a line (json format).
//
//   Slow exit: tid 4242 (pid 4200) inside 301.250 ms (userspace exit), off the CPU 300.874 ms
//   in 2 switches
//     300.812 ms off the CPU, 1 switch, blocked:
//       kernel  __schedule+0x2f0 [kernel]
//               ...
//       user    __libc_read+0x4c [libc.so.6]
//               backend_read+0x1f (src/vmm/devices/blk.cc:120) [exitscope]
//
// Frames are symbolized by OffCpuSymbolizer; each reason a frame could not be resolved is
// printed once per run ("note: ...").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "exitscope/status.h"
#include "sources/bpf/bpf_offcpu_stacks.h"

namespace exitscope::cli {

// `title`: "Slow exit" or "Stuck now".
std::string OffCpuExitText(const sources::bpf::OffCpuExit& e, sources::bpf::OffCpuSymbolizer& sym,
                           std::string_view title);
// {"slow_exit"|"stuck": {tid, pid, kind, inside_ns, off_cpu_ns, switches, stack_drops,
//  other_off_cpu_ns, sites: [{off_cpu_ns, switches, preempted, in_progress, kernel: [frame],
//  user: [frame], note}]}}, frame: {ip, function, offset, module, file, line, text}.
nlohmann::json OffCpuExitJson(const sources::bpf::OffCpuExit& e,
                              sources::bpf::OffCpuSymbolizer& sym, bool stuck);
// The slow exits that ended since the last call, drained from `s`: one text block (or one
// JSON line) each.
Result<std::vector<std::string>> OffCpuEnded(sources::bpf::BpfOffCpuStacks& s,
                                             sources::bpf::OffCpuSymbolizer& sym, bool json);
// The exits inside for `slow_ns` or more now ("Stuck now", or {"stuck": ...} lines).
Result<std::string> OffCpuStuck(const sources::bpf::BpfOffCpuStacks& s,
                                sources::bpf::OffCpuSymbolizer& sym, bool json, uint64_t slow_ns);
// The symbolizer's notes not printed yet, "note: ...\n" each (`*printed`: how many were).
std::string NewOffCpuNotes(const sources::bpf::OffCpuSymbolizer& sym, size_t* printed);

}  // namespace exitscope::cli
