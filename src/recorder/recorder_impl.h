// recorder/recorder_impl.h: the Recorder's out-of-line state (Recorder::Impl) and the helpers
// its files share: recorder.cc (creation, slow paths, device events, metadata, snapshots),
// watchdog.cc (the watchdog thread) and dump_signal.cc (dump on signal). Not public API.
#pragma once

#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "exitscope/recorder.h"
#include "recorder/stack_capture.h"

namespace exitscope {

struct Recorder::Impl {
  Impl(const RecorderOptions& o)
      : options(o),
        device_events(o.device_events),
        inflight(o.inflight_ios),
        vcpu_counters(o.num_vcpus),
        stacks(o.stacks, o.num_vcpus) {}

  RecorderOptions options;
  DeviceEventRing device_events;
  InflightIoTable inflight;

  mutable std::mutex mu;  // everything below that is not atomic
  std::deque<FindingRecord> findings;
  uint64_t findings_dropped = 0;
  SlowExitHook slow_hook;
  bool slow_log = true;
  LogSink sink;
  FindingHook finding_hook;
  std::map<std::string, std::string> attributes;
  std::vector<std::map<std::string, uint64_t>> vcpu_counters;

  std::atomic<uint64_t> bad_vcpu{0};
  std::atomic<uint64_t> end_without_begin{0};
  std::atomic<uint64_t> begin_without_end{0};
  std::atomic<uint64_t> slow_exits{0};

  // Watchdog.
  std::mutex wd_mu;
  std::condition_variable wd_cv;
  std::thread wd_thread;
  bool wd_stop = false;
  WatchdogOptions wd_options;
  std::atomic<bool> wd_running{false};
  std::atomic<uint64_t> wd_polls{0};  // completed polls (watchdog_polls())

  // Dump on signal.
  std::mutex sig_mu;
  int sig_efd = -1;
  int sig_signo = 0;
  struct sigaction sig_old {};
  std::thread sig_thread;
  std::atomic<bool> sig_stop{false};
  std::string sig_dir;
  DumpOptions sig_options;
  std::string last_signal_dump;  // under mu
  uint64_t signal_dumps = 0;

  // Stack captures of stuck vCPU threads (used by the watchdog thread).
  internal::StackSampler stacks;
};

namespace internal {

// Reads the in-progress exit of a vCPU slot under its seqlock. False when none or when the
// slot kept changing.
bool ReadCurrent(const VcpuSlot& v, ExitRecord* out, uint64_t* exit_no);

// "exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008)" for a resolved record, named from the
// live address space.
std::string ExitDescription(const Recorder& rec, const ExitRecord& r);

// A finding about the (resolved) exit `r`, without its text.
FindingRecord ExitFinding(const ExitRecord& r, FindingType type, uint64_t now_ns,
                          uint64_t duration_ns);

// Claims the right to emit the end finding of stall `exit_no` (one end per stall, whoever sees
// the end first: the vCPU's slow path or the watchdog). Claims only grow.
bool ClaimStallEnd(VcpuSlot& v, uint64_t exit_no) noexcept;

// "<prefix> ended after 22.31 s (was stuck)".
std::string StallEndLine(const std::string& prefix, uint64_t ns);

}  // namespace internal
}  // namespace exitscope
