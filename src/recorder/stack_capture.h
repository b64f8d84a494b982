// recorder/stack_capture.h: capturing what a stuck vCPU thread is doing (docs/stacks.md).
// Not public API; the public types are exitscope/stack.h.
//
// A capture, made by the watchdog thread for one vCPU stuck in exit number N:
//
//   watchdog                                     stuck vCPU thread
//   --------                                     -----------------
//   /proc/self/task/TID/stat   -> state
//   /proc/self/task/TID/stack  -> kernel frames (root)
//   buffer: Idle -> Pending, g_pending = buffer
//   tgkill(pid, TID, signo) ----------------->   handler: buffer Pending -> Running (CAS)
//                                                 still inside exit N? unwind (libunwind,
//                                                 from the signal frame) into buffer.ips
//   wait (bounded) for Done / Gone  <---------   buffer -> Done (or Gone: the exit ended)
//   timeout: Pending -> Withdrawn (CAS); if the handler already runs, wait for it
//   symbolize buffer.ips (libdw, cached) -> user frames
//
// A thread in uninterruptible sleep (state D) runs no handler until it wakes: it is not
// signalled; its user frame is the return address in /proc/self/task/TID/syscall.
// The handler never allocates or locks: the buffer (max_frames addresses per vCPU) is
// allocated at creation, and a handler that finds no request for its thread returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "exitscope/recorder.h"
#include "exitscope/stack.h"

namespace exitscope::internal {

class Symbolizer;

// What /proc/self/task/TID/ says about a thread; each parser takes the file's text.
// "S" from ".../stat" (the field after the last ')'); 0 when unparseable.
char ParseProcState(std::string_view stat);
// "[<0>] anon_pipe_read+0x5c/0x3b0" lines -> frames (module "[kernel]"); at most `max`.
std::vector<StackFrame> ParseKernelStack(std::string_view text, size_t max);
// ".../syscall": "NR a1..a6 SP PC" while blocked in a system call; "-1 SP PC" outside one;
// "running". The PC (the user return address), if any.
std::optional<uint64_t> ParseSyscallPc(std::string_view text);

// One vCPU's signal-handler buffer.
struct CaptureBuffer {
  enum : uint32_t { kIdle, kPending, kRunning, kDone, kGone, kWithdrawn };
  std::atomic<uint32_t> state{kIdle};
  // Written by the watchdog before it publishes the request; atomic because a late handler of
  // an earlier, withdrawn request may read them meanwhile (it then finds no pending state).
  std::atomic<int32_t> tid{0};
  std::atomic<const VcpuSlot*> slot{nullptr};
  std::atomic<uint64_t> expected_exit{0};
  uint32_t cap = 0;
  uint32_t n = 0;
  uint32_t dropped = 0;
  uint64_t handler_ns = 0;  // time the handler took (CLOCK_MONOTONIC), for bench/
  uint64_t* ips = nullptr;
};

// The captures of one recorder: buffers, counters, the signal it owns, the symbolizer.
class StackSampler {
 public:
  StackSampler(const StackOptions& options, uint32_t num_vcpus);
  ~StackSampler();

  Status InstallSignal(int signo);
  void RemoveSignal();
  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) noexcept { enabled_.store(on, std::memory_order_relaxed); }
  const StackOptions& options() const noexcept { return options_; }
  StackCounters counters() const noexcept;

  // Captures vCPU `vcpu` (slot `slot`, thread `tid`) inside exit `exit_no`. On the watchdog
  // thread only. `capture` numbers it within its stall. What cannot be read at all (the kernel
  // stack without privilege) is said once, in the note of the first capture that lacks it.
  ThreadStack Capture(uint32_t vcpu, const VcpuSlot& slot, int32_t tid, uint64_t exit_no,
                      uint32_t capture);
  void CountSkipped() noexcept { skipped_.fetch_add(1, std::memory_order_relaxed); }
  // How long the stuck thread spent in the handler for `vcpu`'s last capture (bench/).
  uint64_t last_handler_ns(uint32_t vcpu) const noexcept { return buffers_[vcpu].handler_ns; }

 private:
  bool SignalUser(CaptureBuffer* b, int32_t tid, const VcpuSlot& slot, uint64_t exit_no,
                  ThreadStack* out);

  const StackOptions options_;
  std::atomic<bool> enabled_;
  std::unique_ptr<CaptureBuffer[]> buffers_;
  std::unique_ptr<uint64_t[]> ips_;
  std::unique_ptr<Symbolizer> symbolizer_;
  int signo_ = 0;  // 0: no handler installed by this recorder
  bool kernel_note_logged_ = false;
  std::atomic<uint64_t> captures_{0}, timeouts_{0}, exit_changed_{0}, frames_dropped_{0},
      skipped_{0};
};

}  // namespace exitscope::internal
