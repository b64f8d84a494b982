// report/format.h: human formatting shared by every renderer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exitscope/clock.h"
#include "exitscope/stack.h"

namespace exitscope::report {

// A duration in the unit a human reads best: "812 ns", "25.31 us", "4.20 ms", "22.31 s". The
// library's one duration formatter (exitscope/clock.h FormatDurationNs), under the name the
// renderers used before it was shared.
inline std::string FormatDuration(uint64_t ns) {
  return FormatDurationNs(ns);
}

// part / whole in percent; 0 when whole is 0.
inline double PercentOf(uint64_t part, uint64_t whole) {
  return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// Nanoseconds as microseconds with two decimals ("32004.80"), as perf kvm stat prints.
std::string FormatUsec(uint64_t ns);

// A captured stack's frames, innermost first: the kernel frames (a thread in a system call is
// innermost there), then the user frames, each as FormatFrame writes it
// ("anon_pipe_read+0x5c [kernel]", "Read+0x1f (src/vmm/devices/blk.cc:120) [exitscope]").
// `marked`: each prefixed "k " or "u " (the text report's lines).
std::vector<std::string> StackFrameLines(const ThreadStack& s, bool marked = false);
// The frames above joined by " <- ", innermost first (a CSV field).
std::string JoinedStackFrames(const ThreadStack& s);
// What the capture was: "thread 4301, state S, capture 1, 7 user frames not kept"
// (the parts that are known).
std::string StackHeadline(const ThreadStack& s);
// The /proc state letter as text: "S"; "" when unknown (0); "\x01" for a byte that is no
// letter (a damaged dump).
std::string StackStateText(char state);

}  // namespace exitscope::report
