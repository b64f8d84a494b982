// recorder/describe.h: helpers shared by the recorder and the dump code (not public API).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "exitscope/dump.h"
#include "exitscope/exit_record.h"

namespace exitscope::internal {

// "exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008)", "exit PIO read 1B from com1.RBR (port
// 0x3f8)", "exit HLT". `device` "" = unassigned.
std::string DescribeExit(ExitKind kind, AccessDir dir, uint8_t size, uint64_t addr,
                         std::string_view device, std::string_view reg);

ProcessInfo ReadProcessInfo();
HostInfo ReadHostInfo();

}  // namespace exitscope::internal
