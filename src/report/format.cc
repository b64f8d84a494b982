#include "report/format.h"

#include <fmt/format.h>

namespace exitscope::report {

std::string FormatUsec(uint64_t ns) {
  return fmt::format("{:.2f}", static_cast<double>(ns) / 1e3);
}

std::vector<std::string> StackFrameLines(const ThreadStack& s, bool marked) {
  std::vector<std::string> out;
  out.reserve(s.kernel.size() + s.user.size());
  for (const StackFrame& f : s.kernel) out.push_back((marked ? "k " : "") + FormatFrame(f));
  for (const StackFrame& f : s.user) out.push_back((marked ? "u " : "") + FormatFrame(f));
  return out;
}

std::string JoinedStackFrames(const ThreadStack& s) {
  std::string out;
  for (const std::string& f : StackFrameLines(s)) {
    if (!out.empty()) out += " <- ";
    out += f;
  }
  return out;
}

std::string StackStateText(char state) {
  const auto c = static_cast<unsigned char>(state);
  if (c == 0) return {};
  if (c > 0x20 && c < 0x7f) return std::string(1, state);
  return fmt::format("\\x{:02x}", c);
}

std::string StackHeadline(const ThreadStack& s) {
  std::string out = fmt::format("thread {}", s.tid);
  if (s.state != 0) out += fmt::format(", state {}", StackStateText(s.state));
  if (s.capture != 0) out += fmt::format(", capture {}", s.capture);
  if (s.user_dropped != 0) out += fmt::format(", {} user frames not kept", s.user_dropped);
  return out;
}

}  // namespace exitscope::report
