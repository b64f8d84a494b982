// sources/host_tsc.h: trace clocks in nanoseconds: which clocks count TSC cycles, and this
// host's TSC frequency for reading them.
#pragma once

#include <cstdint>
#include <string_view>

#include "sources/kvm_pairing.h"  // ClockScale

namespace exitscope::sources {

// The ClockScale for a trace clock name: identity for nanosecond clocks; for "x86-tsc" (and
// "counter"), cycles at `tsc_khz` kHz (0: the analysing host's TSC frequency, see
// HostTscKhz()).
ClockScale ScaleForClock(std::string_view clock, uint64_t tsc_khz = 0);
// The TSC frequency of this host in kHz: /sys/devices/system/cpu/cpu0/tsc_freq_khz, else
// the "tsc: Detected N MHz" / "Refined TSC" line of the kernel log via /proc/cpuinfo's
// "cpu MHz"; 0 when unknown.
uint64_t HostTscKhz();

}  // namespace exitscope::sources
