// exitscope/stack.h: what a thread stuck in an exit was doing: its call stack (user and kernel
// frames) and its scheduler state, as captured by the watchdog (docs/stacks.md).
//
// The watchdog captures a vCPU thread it finds stuck inside an exit: the thread's state and
// kernel stack from /proc/self/task/TID/ (where readable), and its user stack, unwound inside
// the thread by a real-time signal handler (Recorder::InstallStackSignal) into a buffer
// allocated at creation. Frames are symbolized afterwards, on the watchdog thread (elfutils
// libdw: function+offset, module, file:line; C++ and Rust names demangled), cached by address.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exitscope/export.h"

namespace exitscope {

// One frame, innermost first in a ThreadStack. A frame that could not be resolved keeps its
// address with an empty `function`.
struct StackFrame {
  uint64_t ip = 0;       // the instruction (first user frame) or the return address
  uint64_t offset = 0;   // ip - the function's start (0 when unresolved)
  std::string function;  // demangled: "exitscope::vmm::BlockDevice::Write", "anon_pipe_read"
  std::string module;    // "/usr/lib/x86_64-linux-gnu/libc.so.6", "[kernel]"
  std::string file;      // source file where DWARF says, else ""
  uint32_t line = 0;     // 0 when unknown

  bool operator==(const StackFrame&) const = default;
};

// One capture of a stuck thread.
struct ThreadStack {
  int32_t tid = 0;                 // the vCPU's thread id (0: none was captured)
  char state = 0;                  // /proc state letter ('R', 'S', 'D', ...), 0 when unknown
  uint32_t capture = 0;            // 1, 2, 3...: which capture of this stall (1 = when found stuck)
  uint32_t user_dropped = 0;       // user frames beyond the capture's limit (not kept)
  std::vector<StackFrame> user;    // innermost first
  std::vector<StackFrame> kernel;  // innermost first (/proc/self/task/TID/stack)
  // Why something is missing, one line: "kernel stack not readable (needs root)",
  // "user stack unavailable: the thread is in uninterruptible sleep (D)".
  std::string note;

  bool empty() const noexcept { return tid == 0 && user.empty() && kernel.empty(); }
  bool operator==(const ThreadStack&) const = default;
};

// "backend_read+0x1f (src/vmm/devices/blk.cc:120) [exitscope]"; "0x7f12345678 [libc.so.6]"
// for an unresolved one; kernel frames "anon_pipe_read+0x5c [kernel]".
EXITSCOPE_EXPORT std::string FormatFrame(const StackFrame& f);

// Counters of the stack captures (RecorderCounters holds the rest).
struct StackCounters {
  uint64_t captures = 0;          // captures attached to findings
  uint64_t signal_timeouts = 0;   // the thread did not run the handler in time (state D, masked)
  uint64_t exit_changed = 0;      // the handler ran after the exit ended: nothing kept
  uint64_t frames_dropped = 0;    // user frames beyond max_frames, summed
  uint64_t captures_skipped = 0;  // stalls past captures_per_stall, or capture switched off
};

}  // namespace exitscope
