// KvmDeviceMap from QEMU's memory tree: `info mtree -f` text (a file or QMP), rules in
// qemu_mtree.h and docs/qemu.md.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "exitscope/register_map.h"
#include "sources/kvm_device_map.h"
#include "sources/qemu_mtree.h"
#include "sources/qemu_qmp.h"

namespace exitscope::sources {
namespace {

// AddressSpace names are [A-Za-z0-9_.:-]{1,63}; QEMU's may hold anything ("bus master
// container", "0000:01:00.0 BAR 0"). The key only has to be unique: QEMU's own name is what
// Resolve returns.
std::string DeviceKey(std::string_view qemu_name) {
  std::string k(qemu_name.substr(0, 56));
  for (char& c : k) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '-';
    if (!ok) c = '_';
  }
  return k;
}

}  // namespace

Result<std::unique_ptr<KvmDeviceMap>> KvmDeviceMap::FromQemuMtree(std::string_view text,
                                                                  std::string_view origin) {
  auto views = ParseQemuMtreeFlat(text, origin);
  if (!views) return Propagate(views);
  const QemuFlatView* io = FindQemuView(*views, "I/O");
  const QemuFlatView* mem = FindQemuView(*views, "memory");
  if (mem == nullptr) mem = FindQemuView(*views, "cpu-memory-0");
  if (io == nullptr && mem == nullptr) {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: no FlatView of address space \"memory\" or \"I/O\" in this "
                            "`info mtree -f` output",
                            origin));
  }
  std::unique_ptr<KvmDeviceMap> m(new KvmDeviceMap());
  // One batch, one table: O(n log n) time and O(n) memory for n ranges.
  AddressSpace::Batch batch = m->space_->BeginBatch();
  std::unordered_map<std::string, uint32_t> by_name;  // QEMU name -> device index
  std::unordered_set<std::string> keys;               // AddressSpace names taken
  std::unordered_map<std::string, int> suffixes;      // last "-N" given per key
  std::unordered_map<std::string, std::shared_ptr<const RegisterMap>> maps;
  for (const auto& [view, space] : {std::pair{io, IoSpace::kPio}, std::pair{mem, IoSpace::kMmio}}) {
    if (view == nullptr) continue;
    for (const QemuFlatRange& r : view->ranges) {
      if (r.is_memory()) continue;
      // PIO ranges past 0xffff do not exist on x86 (the I/O view ends there).
      if (space == IoSpace::kPio && r.start > 0xffff) continue;
      const uint64_t last = space == IoSpace::kPio ? std::min<uint64_t>(r.last, 0xffff) : r.last;
      // [0, 2^64 - 1] has no size in 64 bits: its last byte is left out.
      const uint64_t size = last - r.start + 1 == 0 ? last - r.start : last - r.start + 1;
      const std::string_view map_name = QemuRegisterMapFor(r.name, r.region_offset + size);
      uint32_t dev = 0;
      if (auto it = by_name.find(r.name); it != by_name.end()) {
        dev = it->second;
      } else {
        const std::string base = DeviceKey(r.name);
        std::string key = base;
        for (int& n = suffixes[base]; !keys.insert(key).second;) {
          key = fmt::format("{}-{}", base, ++n);
        }
        const std::string kind = r.name == "io"     ? "unassigned"
                                 : map_name.empty() ? "qemu"
                                                    : std::string(map_name);
        auto added = batch.AddDevice({.name = key, .kind = kind});
        if (!added) {
          return Fail(ErrorCode::kInvalidArgument,
                      fmt::format("{}: region '{}': {}", origin, r.name, added.error().message));
        }
        dev = *added;
        by_name.emplace(r.name, dev);
        if (m->names_.size() <= dev) m->names_.resize(dev + 1);
        m->names_[dev] = r.name;
      }
      std::shared_ptr<const RegisterMap> map;
      if (!map_name.empty()) {
        auto& cached = maps[std::string(map_name)];
        if (!cached) {
          auto builtin = RegisterMap::Builtin(map_name);
          if (!builtin) return Propagate(builtin);
          cached = *builtin;
        }
        map = cached;
      }
      const bool ecam = r.name == kQemuEcamRegion;
      if (Status s = batch.AddRange(space, r.start, size, dev, map); !s) {
        return Fail(ErrorCode::kInvalidArgument,
                    fmt::format("{}: region '{}': {}", origin, r.name, s.error().message));
      }
      if (map && (r.region_offset != 0 || ecam)) {
        m->extras_[{static_cast<uint8_t>(space), r.start}] = {r.region_offset, ecam};
      }
    }
  }
  EXITSCOPE_RETURN_IF_ERROR(m->space_->Commit(std::move(batch)));
  return m;
}

Result<std::unique_ptr<KvmDeviceMap>> KvmDeviceMap::LoadQmp(const std::string& socket_path) {
  auto text = QmpHumanMonitorCommand(socket_path, "info mtree -f");
  if (!text) return Propagate(text);
  if (!LooksLikeQemuMtreeFlat(*text)) {
    return Fail(ErrorCode::kUnavailable,
                fmt::format("{}: `info mtree -f` answered '{}': not a memory tree", socket_path,
                            text->substr(0, text->find('\n')).substr(0, 60)));
  }
  return FromQemuMtree(*text, socket_path);
}

}  // namespace exitscope::sources
