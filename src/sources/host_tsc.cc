#include "sources/host_tsc.h"

#include <charconv>
#include <fstream>
#include <string>

namespace exitscope::sources {

ClockScale ScaleForClock(std::string_view clock, uint64_t tsc_khz) {
  if (clock == "x86-tsc" || clock == "counter" || clock == "tsc") {
    if (tsc_khz == 0) tsc_khz = HostTscKhz();
    if (tsc_khz == 0) return {};
    return ClockScale::FromTscKhz(tsc_khz);
  }
  return {};
}

uint64_t HostTscKhz() {
  {
    std::ifstream f("/sys/devices/system/cpu/cpu0/tsc_freq_khz");
    uint64_t khz = 0;
    if (f >> khz && khz > 0) return khz;
  }
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.starts_with("cpu MHz")) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      double mhz = 0;
      std::string_view v(line);
      v.remove_prefix(colon + 1);
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      std::from_chars(v.data(), v.data() + v.size(), mhz);
      if (mhz > 0) return static_cast<uint64_t>(mhz * 1000.0 + 0.5);
    }
  }
  return 0;
}

}  // namespace exitscope::sources
