// sources/kvm_device_map.h: resolves ports and MMIO addresses seen in kvm traces to devices
// and registers, using the recorder's AddressSpace and RegisterMaps.
//
// Two ways to build one:
//  - from a recorder dump of the same VM (`exitscope kvm report --device-map vm.dump`): its
//    devices, ranges and register maps, exactly as the VMM registered them;
//  - from a small text file, one device range per line:
//
//      # name   kind       space  base        length   [regmap]
//      com1     uart16550  pio    0x3f8       8        uart16550
//      nvme0    nvme       mmio   0xfebf0000  0x4000   nvme
//      dbg      debug-exit pio    0xe9        1
//
//    Numbers are decimal or 0x-hex; `regmap` is a builtin map name (RegisterMap::Builtin:
//    uart16550, nvme, pci-config, virtio-mmio, virtio-pci-common) or a path to a .map file
//    (relative paths are taken from the device-map file's folder). A device may own several
//    ranges (one line each, same name and kind). Errors name "file:line: reason". Only a
//    regular file of at most kMaxDeviceMapBytes is read: a directory, a FIFO or a device
//    node is refused before anything is read.
//
//  - from QEMU's `info mtree -f` (detected by content; the file, or live from QEMU's QMP
//    socket with LoadQmp): devices are QEMU's own region names, builtin register maps are
//    chosen by region name (qemu_mtree.h QemuRegisterMapFor, docs/qemu.md).
//
// Lookups are cached per (space, address, size): a trace touches few distinct addresses, so
// register names are formatted once and the returned views stay valid for the map's life.
// Resolve is thread-safe (the cache is behind a mutex): the pairers of a capture read in time
// segments on threads share one map (docs/trace-files.md, "Segments").
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "exitscope/address_space.h"
#include "exitscope/status.h"
#include "sources/kvm_pairing.h"

namespace exitscope::sources {

class KvmDeviceMap final : public KvmDeviceResolver {
 public:
  // Text device maps larger than this are refused before they are read (a map of a real VM
  // is a few KiB). Dumps given as maps are bounded by the dump reader.
  static constexpr uint64_t kMaxDeviceMapBytes = 16u << 20;
  // Parses the text format above, or QEMU's `info mtree -f` output (FromQemuMtree) when the
  // text is QEMU's (LooksLikeQemuMtreeFlat: pasted from the monitor, or malformed, too).
  static Result<std::unique_ptr<KvmDeviceMap>> Parse(std::string_view text, std::string_view origin,
                                                     const std::string& base_dir = ".");
  static Result<std::unique_ptr<KvmDeviceMap>> LoadText(const std::string& path);
  // Reads a recorder dump (ReadDump) and takes its address space.
  static Result<std::unique_ptr<KvmDeviceMap>> LoadDump(const std::string& path);
  // A dump file (by magic) or a text device map (either text format).
  static Result<std::unique_ptr<KvmDeviceMap>> Load(const std::string& path);
  // QEMU's `info mtree -f` (qemu_mtree.h): ports from the view of address space "I/O", MMIO
  // addresses from that of "memory" (else "cpu-memory-0"). Each range that is not RAM or ROM
  // becomes a range of the device named as QEMU names the region (several ranges of one name
  // are one device, as in QEMU's trace); a region QemuRegisterMapFor knows gets that builtin
  // register map, offsets counted from the region's start (the " @offset" of a fragment),
  // and the ECAM window (pcie-mmcfg-mmio) resolves to "bb:dd.f.REGISTER".
  static Result<std::unique_ptr<KvmDeviceMap>> FromQemuMtree(std::string_view text,
                                                             std::string_view origin);
  // Runs `info mtree -f` on a live QEMU through its QMP socket (qemu_qmp.h) and parses it.
  static Result<std::unique_ptr<KvmDeviceMap>> LoadQmp(const std::string& socket_path);

  bool Resolve(SubKeyKind kind, uint64_t addr, uint32_t size, AccessDir dir,
               std::string_view* device, std::string_view* reg) const override;

  const AddressSpace& address_space() const noexcept { return *space_; }
  size_t device_count() const noexcept { return space_->device_count(); }

 private:
  KvmDeviceMap() : space_(std::make_unique<AddressSpace>()) {}
  // The register name of resolution `r`, counting offsets as the range's RangeExtra says.
  std::string ExtraRegisterName(IoSpace space, uint64_t addr, uint32_t size, AccessDir dir,
                                const Resolution& r) const;
  struct Key {
    uint64_t addr;
    uint32_t size;
    uint8_t space;
    uint8_t dir;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const noexcept {
      return std::hash<uint64_t>()(k.addr * 0x9e3779b97f4a7c15ull ^ (k.size << 3) ^ (k.dir << 1) ^
                                   k.space);
    }
  };
  struct Entry {
    bool found = false;
    std::string_view device, reg;
  };
  // A QEMU range whose register offsets do not start at the range's base: a fragment of a
  // region (" @offset"), or the ECAM window (one pci-config map per 4 KiB function).
  struct RangeExtra {
    uint64_t region_offset = 0;
    bool ecam = false;
  };
  std::unique_ptr<AddressSpace> space_;
  std::deque<std::string> names_;                              // device names by index
  std::map<std::pair<uint8_t, uint64_t>, RangeExtra> extras_;  // by (space, range base)
  mutable std::mutex mu_;                                      // regs_ and cache_
  mutable std::deque<std::string> regs_;
  mutable std::unordered_map<Key, Entry, KeyHash> cache_;
};

}  // namespace exitscope::sources
