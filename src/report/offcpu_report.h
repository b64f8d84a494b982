// report/offcpu_report.h: the one layout of the slow exits seen from the kernel
// (analysis/offcpu_exits.h, `kvm stat --bpf --stacks`, docs/kvm-stacks.md): the live lines
// of `kvm stat` and `kvm live` and the final report's section are written here.
//
//   Slow exit: tid 4242 (pid 4200) inside 301.250 ms (userspace exit), off the CPU 300.874 ms
//   in 2 switches
//     300.812 ms off the CPU, 1 switch, blocked:
//       kernel  __schedule+0x2f0 [kernel]
//               ...
//       user    __libc_read+0x4c [libc.so.6]
//               backend_read+0x1f (src/vmm/devices/blk.cc:120) [exitscope]
//
// JSON: one object per exit, {tid, pid, kind, stuck, start_ns, end_ns (ended), inside_ns,
// off_cpu_ns, switches, stack_drops, other_off_cpu_ns, other_switches, sites: [{off_cpu_ns,
// switches, preempted, in_progress, kernel: [frame], user: [frame], note}]}, a frame {ip,
// text, function, offset, module, file, line} or {ip, text, unresolved: true}.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "analysis/offcpu_exits.h"

namespace exitscope::report {

// One exit as text; `title`: "Slow exit", "Stuck now", "Stuck at the end".
std::string OffCpuExitText(const analysis::OffCpuSlowExit& e, std::string_view title);
// One exit as its JSON object (the live lines wrap it: {"slow_exit": ...} / {"stuck": ...}).
nlohmann::json OffCpuExitJson(const analysis::OffCpuSlowExit& e);
// What an exit was doing in one phrase: "inside 51.482 ms, blocked in anon_pipe_read
// [kernel], from OffCpuBlockedReader(int) (file.cc:44)" (the longest site's frames).
std::string OffCpuExitHeadline(const analysis::OffCpuSlowExit& e);

// The final report's section "Slow exits seen from the kernel, with their stacks": the
// `max_text` slowest as text, what was left out, the symbolizer's notes. Ends with a newline.
std::string OffCpuSectionText(const analysis::OffCpuSlowExits& s, size_t max_text = 20);
// The diagnosis's line on the slowest of them ("" when there is none): where its thread
// blocked in the kernel and the VMM's own innermost frame.
std::string OffCpuDiagnosisLine(const analysis::OffCpuSlowExits& s);

}  // namespace exitscope::report
