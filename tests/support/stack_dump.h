// tests/support/stack_dump.h: a Dump as the recorder gives it after its watchdog captured a
// stuck vCPU thread (exitscope/stack.h): thread ids, stack counters, a stuck-exit finding with
// user and kernel frames, a later capture with only a note, and findings without stacks around
// them. Shared by the dump format, report, CLI and C API tests of the stack captures.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "exitscope/dump.h"

namespace exitscope::test {

inline StackFrame Frame(uint64_t ip, uint64_t off, std::string fn, std::string module,
                        std::string file = "", uint32_t line = 0) {
  return {.ip = ip,
          .offset = off,
          .function = std::move(fn),
          .module = std::move(module),
          .file = std::move(file),
          .line = line};
}

// A dump as the recorder would give it after the watchdog found vCPU 1 stuck: thread ids,
// counters, a stuck-exit finding with user and kernel frames, a later capture with only a note,
// and findings without stacks around them.
inline Dump DumpWithStacks() {
  Dump d;
  d.process.comm = "vmm";
  d.process.pid = 4242;
  d.devices.push_back({.index = 0, .id = 0, .name = "vblk0", .kind = "virtio-blk"});
  for (uint32_t v = 0; v < 2; ++v) {
    DumpVcpu c;
    c.vcpu = v;
    c.tid = 4300 + static_cast<int32_t>(v);
    c.counters = {.capacity = 16, .written = 1};
    c.exits.push_back({.start_ns = 1000 + v,
                       .duration_ns = 10,
                       .addr = 0x3f8,
                       .vcpu = v,
                       .kind = ExitKind::kPio,
                       .size = 1,
                       .dir = AccessDir::kWrite});
    d.vcpus.push_back(std::move(c));
  }
  d.stack_counters = {.captures = 2,
                      .signal_timeouts = 1,
                      .exit_changed = 3,
                      .frames_dropped = 17,
                      .captures_skipped = 5};
  FindingRecord slow;
  slow.time_ns = 2000;
  slow.type = FindingType::kSlowExit;
  slow.vcpu = 0;
  slow.text = "vCPU 0: slow";
  d.findings.push_back(slow);
  FindingRecord stuck;
  stuck.time_ns = 3000;
  stuck.type = FindingType::kStuckExitBegin;
  stuck.vcpu = 1;
  stuck.kind = ExitKind::kMmio;
  stuck.device = 0;
  stuck.duration_ns = 20'000'000;
  stuck.text = "vCPU 1: stuck in exit MMIO write 4B to vblk0 (0xd0000050) for 20 ms (still inside)";
  stuck.stack.tid = 4301;
  stuck.stack.state = 'S';
  stuck.stack.capture = 1;
  stuck.stack.user_dropped = 7;
  stuck.stack.user = {
      Frame(0x7f0000001234, 0x24, "__GI___libc_read", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
      Frame(0x5555000042a0, 0x1f, "exitscope::vmm::BlockDevice::Read", "/usr/bin/exitscope",
            "src/vmm/devices/blk.cc", 120),
      Frame(0x555500009999, 0, "", "/usr/bin/exitscope")};
  stuck.stack.kernel = {Frame(0xffffffff81234567, 0x5c, "anon_pipe_read", "[kernel]"),
                        Frame(0xffffffff81200000, 0x1a0, "vfs_read", "[kernel]")};
  d.findings.push_back(stuck);
  FindingRecord later;
  later.time_ns = 4000;
  later.type = FindingType::kStuckExitStack;
  later.vcpu = 1;
  later.text = "vCPU 1: still stuck (capture 2)";
  later.stack.tid = 4301;
  later.stack.state = 'D';
  later.stack.capture = 2;
  later.stack.note = "user stack unavailable: the thread is in uninterruptible sleep (D)";
  d.findings.push_back(later);
  FindingRecord aged;
  aged.time_ns = 5000;
  aged.type = FindingType::kAgedIo;
  aged.device = 0;
  aged.io_id = 9;
  aged.text = "vblk0: I/O 9 in flight";
  d.findings.push_back(aged);
  return d;
}

}  // namespace exitscope::test
