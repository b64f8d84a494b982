// base/clock_name.h: the name of the selected trace clock in a `trace_clock` listing, as
// tracefs shows it and trace-cmd .dat files store it. Not public API.
#pragma once

#include <string>
#include <string_view>

namespace exitscope::base {

// The clock in brackets ("local [x86-tsc] global" -> "x86-tsc"). A listing without brackets
// that is one word names that clock ("x86-tsc\n" -> "x86-tsc"); anything else (several names
// and none selected, an unclosed bracket, nothing) gives "".
std::string SelectedClock(std::string_view listing);

}  // namespace exitscope::base
