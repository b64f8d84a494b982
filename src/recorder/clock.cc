// Clock creation and TSC calibration; enum names of exit_record.h.
#include "exitscope/clock.h"

#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>

#include "exitscope/exit_record.h"

namespace exitscope {
namespace {

bool CpuinfoHasFlag(const std::string& flags, std::string_view flag) {
  std::istringstream in(flags);
  std::string f;
  while (in >> f) {
    if (f == flag) return true;
  }
  return false;
}

std::string CpuinfoFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? std::string() : line.substr(colon + 1);
    }
  }
  return {};
}

#if defined(__x86_64__) || defined(__i386__)
// TSC frequency from CPUID leaf 0x15 (Intel: crystal ratio), 0 when not enumerated.
uint64_t CpuidTscHz() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 0x15) return 0;
  __cpuid_count(0x15, 0, a, b, c, d);
  if (a == 0 || b == 0 || c == 0) return 0;
  return static_cast<uint64_t>(c) * b / a;
}

// Measures ticks per ns against CLOCK_MONOTONIC over ~`window_ns`, bracketing each reading
// by the tightest rdtsc pair found in a few tries.
void Measure(uint64_t window_ns, uint64_t* ticks0, uint64_t* ns0, double* ns_per_tick) {
  auto sample = [](uint64_t* t, uint64_t* ns) {
    uint64_t best = ~0ull;
    for (int i = 0; i < 16; ++i) {
      const uint64_t a = __rdtsc();
      const uint64_t m = Clock::MonotonicNs();
      const uint64_t b = __rdtsc();
      if (b - a < best) {
        best = b - a;
        *t = a + (b - a) / 2;
        *ns = m;
      }
    }
  };
  uint64_t t0 = 0, m0 = 0, t1 = 0, m1 = 0;
  sample(&t0, &m0);
  timespec req{0, static_cast<long>(window_ns)};
  nanosleep(&req, nullptr);
  sample(&t1, &m1);
  *ticks0 = t1;
  *ns0 = m1;
  *ns_per_tick = (t1 > t0) ? static_cast<double>(m1 - m0) / static_cast<double>(t1 - t0) : 0.0;
}
#endif

const ClockCalibration& CalibrateTscOnce() {
  static std::once_flag once;
  static ClockCalibration cal;
  std::call_once(once, [] {
#if defined(__x86_64__) || defined(__i386__)
    const std::string flags = CpuinfoFlags();
    cal.source = ClockSource::kTsc;
    cal.tsc_invariant = Clock::TscIsInvariant();
    cal.tsc_known_freq = CpuinfoHasFlag(flags, "tsc_known_freq");
    uint64_t t = 0, ns = 0;
    double npt = 0;
    Measure(10'000'000, &t, &ns, &npt);
    const uint64_t cpuid_hz = CpuidTscHz();
    if (cpuid_hz != 0) npt = 1e9 / static_cast<double>(cpuid_hz);
    cal.base_ticks = t;
    cal.base_ns = ns;
    cal.ns_per_tick = npt;
    cal.tsc_hz = npt > 0 ? static_cast<uint64_t>(1e9 / npt + 0.5) : 0;
    if (npt <= 0) cal.source = ClockSource::kMonotonic;
#else
    cal.source = ClockSource::kMonotonic;
#endif
  });
  return cal;
}

}  // namespace

std::string_view ToString(ClockSource s) noexcept {
  return s == ClockSource::kTsc ? "tsc" : "CLOCK_MONOTONIC";
}

bool Clock::TscIsInvariant() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000007u) {
    __get_cpuid(0x80000007u, &a, &b, &c, &d);
    if ((d & (1u << 8)) != 0) return true;
  }
  try {
    const std::string flags = CpuinfoFlags();
    return CpuinfoHasFlag(flags, "constant_tsc") && CpuinfoHasFlag(flags, "nonstop_tsc");
  } catch (...) {
    return false;
  }
#else
  return false;
#endif
}

Clock Clock::Create(ClockChoice choice) {
  Clock clock;
  clock.cal_ = ClockCalibration{};
  clock.cal_.base_ns = MonotonicNs();
  clock.cal_.base_ticks = clock.cal_.base_ns;
  if (choice == ClockChoice::kMonotonic) return clock;
  if (choice == ClockChoice::kAuto && !TscIsInvariant()) return clock;
  const ClockCalibration& tsc = CalibrateTscOnce();
  if (tsc.source == ClockSource::kTsc) clock.cal_ = tsc;
  return clock;
}

std::string FormatDurationNs(uint64_t ns) {
  char buf[64];
  if (ns >= 1'000'000'000ull) {
    std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(ns) / 1e9);
  } else if (ns >= 1'000'000ull) {
    std::snprintf(buf, sizeof buf, "%.2f ms", static_cast<double>(ns) / 1e6);
  } else if (ns >= 1'000ull) {
    std::snprintf(buf, sizeof buf, "%.2f us", static_cast<double>(ns) / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " ns", ns);
  }
  return buf;
}

// ---- exit_record.h -----------------------------------------------------------------------

namespace {
constexpr std::string_view kKindNames[kExitKindCount] = {
    "UNKNOWN",        "MMIO",       "PIO",  "HLT",   "SHUTDOWN",
    "INTR",           "HYPERCALL",  "MSR",  "DEBUG", "SYSTEM_EVENT",
    "INTERNAL_ERROR", "FAIL_ENTRY", "OTHER"};
}

std::string_view ToString(ExitKind k) noexcept {
  const auto i = static_cast<unsigned>(k);
  if (i < kExitKindCount) return kKindNames[i];
  // A value no ExitKind has (a dump from a buggy or newer writer): "kind#99", so that it is
  // shown as itself and never merged with a real kind.
  static const struct Names {
    char s[256][9];
    Names() {
      for (unsigned n = 0; n < 256; ++n) std::snprintf(s[n], sizeof s[n], "kind#%u", n);
    }
  } names;
  return names.s[i & 0xff];
}

std::string_view ToString(AccessDir d) noexcept {
  switch (d) {
    case AccessDir::kRead:
      return "read";
    case AccessDir::kWrite:
      return "write";
    default:
      return "none";
  }
}

std::string_view ToString(IoSpace s) noexcept {
  return s == IoSpace::kPio ? "pio" : "mmio";
}

bool ParseExitKind(std::string_view s, ExitKind* out) noexcept {
  for (int i = 0; i < kExitKindCount; ++i) {
    const std::string_view n = kKindNames[i];
    if (n.size() != s.size()) continue;
    bool eq = true;
    for (size_t j = 0; j < n.size() && eq; ++j) {
      char c = s[j];
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
      if (c == '-') c = '_';
      eq = c == n[j];
    }
    if (eq) {
      *out = static_cast<ExitKind>(i);
      return true;
    }
  }
  if (s == "IO" || s == "io") {
    *out = ExitKind::kPio;
    return true;
  }
  return false;
}

}  // namespace exitscope
