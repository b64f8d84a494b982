#include "report/format.h"

#include <fmt/format.h>

namespace exitscope::report {

std::string FormatUsec(uint64_t ns) {
  return fmt::format("{:.2f}", static_cast<double>(ns) / 1e3);
}

}  // namespace exitscope::report
