// Fuzz target for the device maps: the text map and QEMU's `info mtree -f`
// (KvmDeviceMap::Parse, which hands QEMU's text to FromQemuMtree / sources/qemu_mtree.cc).
// Register maps named by path are looked up in a folder that does not exist, so only builtin
// maps load: the target reads no file. An input starting with "#!scale text|mtree N" is a map
// of N ranges generated here, then the rest of the input (device_map_scale.h): the seeds of
// 100,000 ranges are one line each.
#include <string>
#include <string_view>

#include "device_map_scale.h"
#include "fuzz_target.h"
#include "sources/kvm_device_map.h"

using exitscope::AccessDir;
using exitscope::SubKeyKind;
using exitscope::sources::KvmDeviceMap;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string scaled;
  const auto scale = exitscope::fuzz::ExpandScaleDirective(text, &scaled);
  // A directive line alone (the seeds) is a valid map: it must load, whatever its size.
  const bool must_load = scale != exitscope::fuzz::ScaleKind::kNone &&
                         text.find('\n') + 1 == size && scaled.size() > 200;
  if (scale != exitscope::fuzz::ScaleKind::kNone) text = scaled;
  auto m = KvmDeviceMap::Parse(text, "fuzz.devmap", "/nonexistent-fuzz-dir");
  if (!m) {
    if (must_load) exitscope::fuzz::InvariantFailed("a generated device map did not load");
    return 0;
  }
  std::string_view device, reg;
  if (must_load &&
      (!(*m)->Resolve(SubKeyKind::kMmio, 0x100000000ull, 4, AccessDir::kRead, &device, &reg) ||
       (device != "dev0" && device != "r0"))) {
    exitscope::fuzz::InvariantFailed("a generated device map does not resolve its first range");
  }
  for (const uint64_t addr : {0x0ull, 0x3f8ull, 0x3fdull, 0xcf8ull, 0xfebf0000ull, 0xfebf1008ull,
                              0x100000000ull, 0x100000ffcull + 0x1000ull * 99999, ~0ull}) {
    for (const auto kind : {SubKeyKind::kPort, SubKeyKind::kMmio, SubKeyKind::kMsr}) {
      (void)(*m)->Resolve(kind, addr, 4, AccessDir::kWrite, &device, &reg);
      (void)(*m)->Resolve(kind, addr, 1, AccessDir::kRead, &device, &reg);
    }
  }
  return 0;
}
