// vmm/fault_injection.h: the --inject specs of `exitscope run`, parsed and applied.
//
//   delay:DEVICE[.REGISTER]:MS[:EVERY_N]  delay the handling of matching exits by MS
//                                         (every Nth matching exit; default every one)
//   spin:DEVICE[.REGISTER]:MS[:EVERY_N]   the same, busy-waiting on the vCPU thread instead of
//                                         sleeping (a handler that polls: state R, no system call)
//   backend-delay:DEVICE:MS[:EVERY_N]     delay the device's backend I/O by MS (every Nth I/O)
//   backend-error:DEVICE:EVERY_N          fail every Nth backend I/O (the guest sees an error)
//   lock:DEVICE:MS:EVERY_N                another thread holds the device's lock for MS before
//                                         every Nth I/O is handled (lock contention in the exit)
//
// DEVICE is a device name ("nvme0", "uart0"); REGISTER a register name of its map, with an
// array element index where the map has arrays ("SQ1TDBL"). Names are checked against the
// address space when the rules are bound (Bind, CheckDeviceFaults), so a typo is a usage error
// before the VM runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "exitscope/address_space.h"
#include "exitscope/status.h"

namespace exitscope::vmm {

struct InjectSpec {
  enum class Kind : uint8_t { kDelay, kBackendDelay, kBackendError, kLock, kSpin };
  Kind kind = Kind::kDelay;
  std::string device;
  std::string reg;  // kDelay / kSpin only; empty = every register of the device
  uint64_t ms = 0;
  uint64_t every = 1;
  std::string text;  // the spec as given
};

// Parses one --inject value. kInvalidArgument with a message naming the spec and the problem.
Result<InjectSpec> ParseInjectSpec(std::string_view text);

// Checks the specs that act inside a device (backend-delay, backend-error, lock; delay specs
// are Bind's) against `space` and `device`, the one device that models them. kInvalidArgument
// naming the spec: "no device named 'nvme9'", or a device that has no backend / no lock.
Status CheckDeviceFaults(const std::vector<InjectSpec>& specs, const AddressSpace& space,
                         std::string_view device);

// The exit-delay rules bound to device / register indices, checked on every userspace exit.
class ExitDelayInjector {
 public:
  // Resolves the kDelay specs against `space` (others are ignored). kInvalidArgument for an
  // unknown device or a register its map does not have.
  static Result<std::unique_ptr<ExitDelayInjector>> Bind(const std::vector<InjectSpec>& specs,
                                                         const AddressSpace& space);

  // The delay (ms) to apply to an exit that resolved to `res`; 0 = none. Counts matches.
  // `*spin` says whether a matching spin rule asks to busy-wait instead of sleeping.
  uint64_t DelayFor(const Resolution& res, bool* spin = nullptr) noexcept;
  bool empty() const noexcept { return rules_.empty(); }

 private:
  struct Rule {
    uint32_t device = kUnassigned;
    const RegisterMap* map = nullptr;  // the range's map the register index refers to
    uint32_t reg = kNoRegister;        // kNoRegister = any register of the device
    uint32_t element = 0;
    uint64_t ms = 0;
    uint64_t every = 1;
    bool spin = false;  // busy-wait (spin:) instead of sleeping (delay:)
    std::unique_ptr<std::atomic<uint64_t>> matches;
  };
  std::vector<Rule> rules_;
};

}  // namespace exitscope::vmm
