// vmm/device.h: what a device model implements to be reached from the vCPU loop.
//
// The vCPU loop resolves an exit's address through the AddressSpace (the library's lookup is
// the VMM's bus) and calls the device at the offset inside its range. A device answers an
// access it does not implement (no register there, wrong width) by returning false: the loop
// then answers like hardware (reads all ones, writes dropped) and logs the address once.
#pragma once

#include <cstdint>
#include <string>

namespace exitscope::vmm {

// What the access asks of the vCPU loop besides the data (the debug-exit device uses it).
enum class VcpuRequest : uint8_t {
  kNone = 0,
  kFinish,  // the guest reported its result on this vCPU: stop it (code = result)
  kFault,   // a CPL0 fault stub reported an exception vector (code = vector): fatal
};

struct AccessContext {
  uint32_t vcpu = 0;
  VcpuRequest request = VcpuRequest::kNone;
  uint32_t code = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // Reads `size` (1, 2, 4 or 8) bytes at `offset` into data (little-endian). false = nothing
  // implemented there.
  virtual bool Read(uint64_t offset, uint8_t* data, uint32_t size, AccessContext& ctx) = 0;
  virtual bool Write(uint64_t offset, const uint8_t* data, uint32_t size, AccessContext& ctx) = 0;
};

// Little-endian helpers for register values.
inline uint64_t LoadLe(const uint8_t* p, uint32_t size) {
  uint64_t v = 0;
  for (uint32_t i = 0; i < size && i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
inline void StoreLe(uint64_t v, uint8_t* p, uint32_t size) {
  for (uint32_t i = 0; i < size && i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace exitscope::vmm
