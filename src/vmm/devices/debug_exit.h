// vmm/devices/debug_exit.h: the debug-exit device (16 ports at ES_DEBUG_PORT, guests/abi.h).
//
//   +0  EXIT    4B write: the guest's result on this vCPU (0 = pass); the vCPU stops
//   +4  MARKER  4B write: a marker, kept (and recorded as a device note by the VMM)
//   +8  FAULT   4B write by the CPL0 fault stubs: exception vector; fatal for the VM
//   +12 INFO    4B read: ES_DEBUG_MAGIC
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "vmm/device.h"

namespace exitscope::vmm {

class DebugExit final : public Device {
 public:
  // `on_marker` (optional) is called on the vCPU thread for each marker write.
  using MarkerHook = std::function<void(uint32_t vcpu, uint32_t value)>;
  explicit DebugExit(MarkerHook on_marker = nullptr) : on_marker_(std::move(on_marker)) {}

  bool Read(uint64_t offset, uint8_t* data, uint32_t size, AccessContext& ctx) override;
  bool Write(uint64_t offset, const uint8_t* data, uint32_t size, AccessContext& ctx) override;

  uint64_t markers() const { return markers_.load(std::memory_order_relaxed); }

 private:
  MarkerHook on_marker_;
  std::atomic<uint64_t> markers_{0};
};

}  // namespace exitscope::vmm
