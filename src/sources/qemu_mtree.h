// sources/qemu_mtree.h: QEMU's memory map as its monitor prints it with `info mtree -f`, and
// the rules that turn QEMU's region names into devices and register maps (docs/qemu.md).
//
// `info mtree -f` prints one "FlatView" per distinct rendered memory map, after the address
// spaces that share it and its root region; one line per flat range, in address order:
//
//   FlatView #1
//    AS "I/O", root: io
//    Root memory region: io
//     0000000000000070-0000000000000070 (prio 0, i/o): rtc-index
//     0000000000000071-0000000000000071 (prio 0, i/o): rtc @0000000000000001
//     00000000000003f8-00000000000003ff (prio 0, i/o): serial
//
// A range is [start, last] (both inclusive) of region `name`, starting `@offset` bytes into
// that region when the line says so: QEMU's dispatch hands the region that offset plus the
// distance from `start`. Lines may end with the accelerator's name (" KVM": the range is a
// KVM memory slot) and, under `info mtree -f -o`, with the owner (" owner:{dev id=nvme0}");
// `info mtree -f -d` appends a "Dispatch" section to each view. Both are accepted and
// ignored. Flat ranges never overlap.
//
// As pasted from the monitor or a ticket: the prompt line "(qemu) info mtree -f" before the
// tree and "(qemu)" prompt lines after it are skipped, and indentation (spaces or tabs, any
// amount) is ignored: each line says what it is by its content.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "exitscope/status.h"

namespace exitscope::sources {

struct QemuFlatRange {
  uint64_t start = 0;
  uint64_t last = 0;  // inclusive
  int priority = 0;
  std::string type;            // "i/o", "ram", "rom", "romd", "ramd"; "nv-" prefix if non-volatile
  std::string name;            // the region's name: "serial", "rtc", "io", "pc.ram"
  uint64_t region_offset = 0;  // the " @..." part: where in the region `start` falls
  // RAM and ROM (ram, rom, romd, ramd, nv-*) are memory the guest reaches without an exit
  // (or, for romd, reads without one): never a device.
  bool is_memory() const noexcept { return type != "i/o"; }
};

struct QemuFlatView {
  std::vector<std::string> address_spaces;  // "memory", "cpu-memory-0", "I/O", ...
  std::string root;                         // the root region's name ("" if "(none)")
  std::vector<QemuFlatRange> ranges;
};

// Whether text is QEMU's, by lines only QEMU's monitor prints (none of them a valid line of
// the device-map format): a "FlatView #N" header, or no "address-space: " line and one of
// the prompt "(qemu)", an `AS "..."` or "Root memory region:" line or a range line
// (`info mtree -f`, malformed or not: ParseQemuMtreeFlat says where).
bool LooksLikeQemuMtreeFlat(std::string_view text) noexcept;
// "address-space: ..." lines and no "FlatView #N" header (`info mtree` without -f).
bool LooksLikeQemuMtreeTree(std::string_view text) noexcept;

// Parses `info mtree -f` text (with "\n" or "\r\n" line ends). Errors name
// "<origin>:<line>: <reason> in QEMU's `info mtree -f` output: '<the line>'".
Result<std::vector<QemuFlatView>> ParseQemuMtreeFlat(std::string_view text,
                                                     std::string_view origin);

// The view of address space `as` ("memory", "I/O"), or nullptr.
const QemuFlatView* FindQemuView(const std::vector<QemuFlatView>& views,
                                 std::string_view as) noexcept;

// Which of exitscope's builtin register maps (RegisterMap::Builtin) describes a QEMU region,
// by the region name QEMU gives it (QEMU 7.2 hw/): "" for none. `end` is how far into the
// region the flat range reaches (region_offset + length): QEMU's MMIO 16550 with regshift > 0
// spreads its eight registers over more than 8 bytes, which the uart16550 map does not
// describe.
//   serial                          -> uart16550          (hw/char/serial.c, 8 bytes)
//   nvme                            -> nvme               (hw/nvme/ctrl.c: BAR0's registers
//                                                          and doorbells, inside "nvme-bar0")
//   virtio-pci-common-<device>      -> virtio-pci-common  (hw/virtio/virtio-pci.c)
//   virtio-mmio                     -> virtio-mmio        (hw/virtio/virtio-mmio.c)
//   pcie-mmcfg-mmio                 -> pci-config, per 4 KiB function window of the ECAM
//                                      (hw/pci/pcie_host.c; see QemuEcamRegister)
std::string_view QemuRegisterMapFor(std::string_view region, uint64_t end) noexcept;

// The ECAM region's name: offsets in it are bus << 20 | device << 15 | function << 12 | reg.
inline constexpr std::string_view kQemuEcamRegion = "pcie-mmcfg-mmio";
// "bb:dd.f" of an ECAM offset ("00:04.0").
std::string QemuEcamFunction(uint64_t offset);

}  // namespace exitscope::sources
