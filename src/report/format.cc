#include "report/format.h"

#include <fmt/format.h>

namespace exitscope::report {

std::string FormatDuration(uint64_t ns) {
  if (ns < 1'000) return fmt::format("{} ns", ns);
  if (ns < 1'000'000) return fmt::format("{:.2f} us", static_cast<double>(ns) / 1e3);
  if (ns < 1'000'000'000) return fmt::format("{:.2f} ms", static_cast<double>(ns) / 1e6);
  return fmt::format("{:.2f} s", static_cast<double>(ns) / 1e9);
}

std::string FormatUsec(uint64_t ns) {
  return fmt::format("{:.2f}", static_cast<double>(ns) / 1e3);
}

}  // namespace exitscope::report
