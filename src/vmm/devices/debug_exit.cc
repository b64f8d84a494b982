#include "vmm/devices/debug_exit.h"

#include "guests/abi.h"

namespace exitscope::vmm {

bool DebugExit::Read(uint64_t offset, uint8_t* data, uint32_t size, AccessContext&) {
  if (offset != ES_DEBUG_INFO - ES_DEBUG_PORT || size != 4) return false;
  StoreLe(ES_DEBUG_MAGIC, data, 4);
  return true;
}

bool DebugExit::Write(uint64_t offset, const uint8_t* data, uint32_t size, AccessContext& ctx) {
  if (size != 4) return false;
  const uint32_t v = static_cast<uint32_t>(LoadLe(data, 4));
  switch (offset) {
    case ES_DEBUG_EXIT - ES_DEBUG_PORT:
      ctx.request = VcpuRequest::kFinish;
      ctx.code = v;
      return true;
    case ES_DEBUG_MARKER - ES_DEBUG_PORT:
      markers_.fetch_add(1, std::memory_order_relaxed);
      if (on_marker_) on_marker_(ctx.vcpu, v);
      return true;
    case ES_DEBUG_FAULT - ES_DEBUG_PORT:
      ctx.request = VcpuRequest::kFault;
      ctx.code = v;
      return true;
    default:
      return false;
  }
}

}  // namespace exitscope::vmm
