// exitscope/unassigned_log.h: "log this guest address once", in fixed memory.
//
// A guest chooses the addresses it touches: one that scans an unassigned MMIO range touches
// millions of distinct addresses. A set that grows with each new address (the obvious "log
// once per address") then grows host memory without bound, and a mutex around it serialises
// the vCPUs. UnassignedAccessLog remembers at most `capacity` distinct (space, address) pairs
// in a table allocated at construction, lock-free, with a bounded probe: the cost of one
// access is constant, whatever the guest does. Once the table is full, accesses to addresses
// it does not hold are counted (`overflow`) and never logged, so a scan produces at most
// `capacity` log lines, and the counters say how much was not logged.
//
//   exitscope::UnassignedAccessLog seen(4096);
//   // vCPU loop, on an access no device claims:
//   if (seen.FirstTime(exitscope::IoSpace::kMmio, addr)) log_line(...);  // build text only now
//
// Thread-safe: any number of vCPU threads may call FirstTime concurrently; each remembered
// address returns true exactly once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "exitscope/exit_record.h"
#include "exitscope/export.h"

namespace exitscope {

class EXITSCOPE_EXPORT UnassignedAccessLog {
 public:
  static constexpr int kProbe = 8;  // slots looked at per access (the constant cost)
  // `capacity` distinct addresses per space, rounded up to a power of two (at least kProbe).
  explicit UnassignedAccessLog(uint32_t capacity = 4096);

  // True the first time (space, addr) is seen and remembered: the caller logs it. False when
  // it was seen before, or when the table cannot remember it (counted in overflow()).
  // noexcept, lock-free, no allocation.
  bool FirstTime(IoSpace space, uint64_t addr) noexcept;

  uint64_t accesses() const noexcept { return accesses_.load(std::memory_order_relaxed); }
  uint64_t remembered() const noexcept { return remembered_.load(std::memory_order_relaxed); }
  // Accesses to addresses the full table could not remember (never logged; repeats of one
  // such address are each counted).
  uint64_t overflow() const noexcept { return overflow_.load(std::memory_order_relaxed); }
  uint32_t capacity() const noexcept { return mask_ + 1; }

 private:
  uint32_t mask_;
  // Per space: 0 = empty, else addr + 1 (addr 2^64-1 has its own flag).
  std::unique_ptr<std::atomic<uint64_t>[]> slots_[2];
  std::atomic<bool> max_addr_seen_[2] = {false, false};
  std::atomic<uint64_t> accesses_{0};
  std::atomic<uint64_t> remembered_{0};
  std::atomic<uint64_t> overflow_{0};
};

}  // namespace exitscope
