// report/format.h: human formatting shared by every renderer.
#pragma once

#include <cstdint>
#include <string>

#include "exitscope/clock.h"

namespace exitscope::report {

// A duration in the unit a human reads best: "812 ns", "25.31 us", "4.20 ms", "22.31 s". The
// library's one duration formatter (exitscope/clock.h FormatDurationNs), under the name the
// renderers used before it was shared.
inline std::string FormatDuration(uint64_t ns) {
  return FormatDurationNs(ns);
}

// Nanoseconds as microseconds with two decimals ("32004.80"), as perf kvm stat prints.
std::string FormatUsec(uint64_t ns);

}  // namespace exitscope::report
