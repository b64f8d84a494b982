// exitscope/clock.h: the recorder's timestamp source.
//
// The hot path reads raw ticks (Clock::Now): the TSC via rdtsc when the CPU says it is
// invariant (CPUID 0x80000007 EDX bit 8, or /proc/cpuinfo flags constant_tsc + nonstop_tsc),
// else CLOCK_MONOTONIC in nanoseconds (then a tick is a nanosecond). At creation the TSC is
// calibrated against CLOCK_MONOTONIC over 10 ms, once per process (or taken from CPUID leaf
// 0x15 when the CPU enumerates it) and the calibration is kept: every dump carries it, so tick
// values can be mapped to CLOCK_MONOTONIC nanoseconds offline:
//
//   ns = base_ns + (ticks - base_ticks) * ns_per_tick
//
// Example:
//   exitscope::Clock clock = exitscope::Clock::Create();
//   uint64_t t0 = clock.Now();  ...  uint64_t ns = clock.TicksToNs(clock.Now() - t0);
#pragma once

#include <time.h>

#include <cstdint>
#include <string>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include "exitscope/export.h"

namespace exitscope {

enum class ClockSource : uint8_t {
  kMonotonic = 0,  // CLOCK_MONOTONIC nanoseconds; ns_per_tick == 1
  kTsc = 1,        // rdtsc, invariant TSC, calibrated
};

// "tsc" or "CLOCK_MONOTONIC".
std::string_view ToString(ClockSource s) noexcept;

// How the caller wants the clock chosen.
enum class ClockChoice : uint8_t {
  kAuto = 0,       // TSC when invariant, else CLOCK_MONOTONIC
  kTsc = 1,        // TSC even if not known to be invariant (tests, benchmarks)
  kMonotonic = 2,  // always CLOCK_MONOTONIC
};

// The mapping from ticks to CLOCK_MONOTONIC nanoseconds. Stored in dumps.
struct ClockCalibration {
  ClockSource source = ClockSource::kMonotonic;
  double ns_per_tick = 1.0;     // 1 / (TSC GHz) for the TSC
  uint64_t tsc_hz = 0;          // TSC frequency in Hz; 0 for kMonotonic
  uint64_t base_ticks = 0;      // a tick value ...
  uint64_t base_ns = 0;         // ... and the CLOCK_MONOTONIC ns at the same instant
  bool tsc_invariant = false;   // the CPU reported an invariant TSC
  bool tsc_known_freq = false;  // the kernel flags the TSC frequency as known (tsc_known_freq)
};

// Cheap to copy; Now() is inline and lock-free. Thread-safe (immutable after Create).
class EXITSCOPE_EXPORT Clock {
 public:
  // A CLOCK_MONOTONIC clock (no calibration needed).
  Clock() = default;

  // Chooses the source per `choice` and calibrates the TSC (takes ~10 ms when it must be
  // measured). Never fails: falls back to CLOCK_MONOTONIC.
  static Clock Create(ClockChoice choice = ClockChoice::kAuto);

  // Rebuilds a clock from a stored calibration (e.g. a dump's), for conversions only.
  static Clock FromCalibration(const ClockCalibration& c) {
    Clock clock;
    clock.cal_ = c;
    return clock;
  }

  // Current time in ticks. noexcept, no syscall for the TSC (vDSO for CLOCK_MONOTONIC).
  uint64_t Now() const noexcept {
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_expect(cal_.source == ClockSource::kTsc, 1)) return __rdtsc();
#endif
    return MonotonicNs();
  }

  // Duration in ticks -> nanoseconds.
  uint64_t TicksToNs(uint64_t ticks) const noexcept {
    if (cal_.source == ClockSource::kMonotonic) return ticks;
    return static_cast<uint64_t>(static_cast<double>(ticks) * cal_.ns_per_tick);
  }
  // Nanoseconds -> ticks (for thresholds).
  uint64_t NsToTicks(uint64_t ns) const noexcept {
    if (cal_.source == ClockSource::kMonotonic) return ns;
    return static_cast<uint64_t>(static_cast<double>(ns) / cal_.ns_per_tick);
  }
  // Timestamp in ticks -> CLOCK_MONOTONIC nanoseconds.
  uint64_t ToMonotonicNs(uint64_t ticks) const noexcept {
    if (cal_.source == ClockSource::kMonotonic) return ticks;
    const double d = static_cast<double>(static_cast<int64_t>(ticks - cal_.base_ticks));
    return cal_.base_ns + static_cast<int64_t>(d * cal_.ns_per_tick);
  }

  const ClockCalibration& calibration() const noexcept {
    return cal_;
  }
  ClockSource source() const noexcept {
    return cal_.source;
  }

  static uint64_t MonotonicNs() noexcept {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  }

  // True when this CPU reports an invariant TSC (CPUID or /proc/cpuinfo flags).
  static bool TscIsInvariant() noexcept;

 private:
  ClockCalibration cal_;
};

// "22.31 s", "1.25 ms", "830 ns": the human duration used in log lines.
EXITSCOPE_EXPORT std::string FormatDurationNs(uint64_t ns);

}  // namespace exitscope
