// Fuzz target for the text device map (KvmDeviceMap::Parse). Register maps named by path
// are looked up in a folder that does not exist, so only builtin maps load: the target reads
// no file.
#include <string_view>

#include "fuzz_target.h"
#include "sources/kvm_device_map.h"

using exitscope::AccessDir;
using exitscope::SubKeyKind;
using exitscope::sources::KvmDeviceMap;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = KvmDeviceMap::Parse(text, "fuzz.devmap", "/nonexistent-fuzz-dir");
  if (!m) return 0;
  std::string_view device, reg;
  for (const uint64_t addr :
       {0x0ull, 0x3f8ull, 0x3fdull, 0xcf8ull, 0xfebf0000ull, 0xfebf1008ull, ~0ull}) {
    for (const auto kind : {SubKeyKind::kPort, SubKeyKind::kMmio, SubKeyKind::kMsr}) {
      (void)(*m)->Resolve(kind, addr, 4, AccessDir::kWrite, &device, &reg);
      (void)(*m)->Resolve(kind, addr, 1, AccessDir::kRead, &device, &reg);
    }
  }
  return 0;
}
