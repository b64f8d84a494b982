// exitscope/address_space.h: which device (and register) an MMIO address or I/O port belongs to.
//
// Devices are registered once (AddDevice) and get a dense index that never changes; the index
// is what exit records store. A device owns any number of ranges in the MMIO and PIO spaces
// (a PCI device: its BARs), each with an optional RegisterMap. Overlapping ranges are refused
// with an error naming both devices and ranges.
//
//   exitscope::AddressSpace as;
//   uint32_t nvme = *as.AddDevice({.name = "nvme0", .kind = "nvme"});
//   auto map = *exitscope::RegisterMap::Builtin("nvme");
//   (void)as.AddRange(exitscope::IoSpace::kMmio, 0xfebf0000, 0x4000, nvme, map);
//   exitscope::Resolution r = as.Lookup(exitscope::IoSpace::kMmio, 0xfebf1008, 4,
//                                       exitscope::AccessDir::kWrite);
//   // r.device == nvme, r.offset == 0x1008, as.RegisterName(r, 4) == "SQ1TDBL"
//
// Concurrency: Lookup is lock-free and wait-free and may run on any number of vCPU threads
// while another thread adds or removes ranges (e.g. a guest moving a PCI BAR). Mutations
// (serialised by an internal mutex) build a new immutable table and publish it with one
// atomic pointer store; Lookup sees the old or the new table, never a mix. Old tables are
// retired and freed only when the AddressSpace is destroyed (each costs about
// 48 bytes per range + the device table), so an embedder that remaps a BAR thousands of times
// should expect that memory to grow; RegisterMaps are shared, not copied.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "exitscope/exit_record.h"
#include "exitscope/export.h"
#include "exitscope/register_map.h"
#include "exitscope/status.h"

namespace exitscope {

struct DeviceSpec {
  std::string name{};  // unique, e.g. "nvme0"; [A-Za-z0-9_.:-]{1,63}
  std::string kind{};  // e.g. "nvme", "uart16550", "virtio-blk"
  uint64_t id = 0;     // embedder's stable id (e.g. PCI BDF); 0 = use the device index
};

struct DeviceInfo {
  uint32_t index = 0;  // dense, stable for the life of the AddressSpace
  uint64_t id = 0;
  std::string name;
  std::string kind;
};

struct RangeInfo {
  IoSpace space = IoSpace::kMmio;
  uint64_t base = 0;
  uint64_t size = 0;
  uint32_t device = kUnassigned;
  std::shared_ptr<const RegisterMap> map;  // may be null
};

// The answer of a lookup. For unassigned addresses device == kUnassigned and the rest is 0 /
// kNoRegister.
struct Resolution {
  uint32_t device = kUnassigned;
  uint64_t offset = 0;  // addr - range base
  RegisterHit reg;      // reg.reg == kNoRegister when the range has no map or no register there
  const RegisterMap* map = nullptr;  // the range's map (valid while the AddressSpace lives)
  bool assigned() const noexcept { return device != kUnassigned; }
};

namespace internal {
// One immutable generation of the lookup tables. Per space, parallel arrays sorted by base.
struct AddressTable {
  struct Space {
    std::vector<uint64_t> bases;
    std::vector<uint64_t> lasts;  // base + size - 1 (so a range may end at 2^64)
    std::vector<uint32_t> devices;
    std::vector<const RegisterMap*> maps;
    std::vector<std::shared_ptr<const RegisterMap>> owners;  // keeps maps alive
  };
  Space spaces[2];
  std::vector<DeviceInfo> devices;
  uint32_t generation = 0;  // index of this table among all published ones (0 = the first)
};
}  // namespace internal

class EXITSCOPE_EXPORT AddressSpace {
 public:
  AddressSpace();
  ~AddressSpace();
  AddressSpace(const AddressSpace&) = delete;
  AddressSpace& operator=(const AddressSpace&) = delete;

  // Registers a device; returns its index. kAlreadyExists if the name is taken,
  // kInvalidArgument for an empty or malformed name.
  Result<uint32_t> AddDevice(DeviceSpec spec);

  // Maps [base, base + size) of `space` to `device`. size > 0, base + size must not wrap past
  // 2^64 (PIO: past 0x10000). Refuses overlap: kAlreadyExists with a message such as
  // "mmio range [0xfebf0000, 0xfebf3fff] of nvme1 overlaps [0xfebf0000, 0xfebf3fff] of nvme0".
  Status AddRange(IoSpace space, uint64_t base, uint64_t size, uint32_t device,
                  std::shared_ptr<const RegisterMap> map = nullptr);
  // Removes the range starting exactly at `base` (kNotFound otherwise).
  Status RemoveRange(IoSpace space, uint64_t base);
  // Moves a range (BAR reprogramming): remove + add in one published step; on overlap
  // nothing changes.
  Status MoveRange(IoSpace space, uint64_t old_base, uint64_t new_base);

  // Resolves an access. noexcept, lock-free, no allocation; O(log ranges).
  Resolution Lookup(IoSpace space, uint64_t addr, uint32_t size,
                    AccessDir dir = AccessDir::kNone) const noexcept {
    return LookupIn(*table_.load(std::memory_order_acquire), space, addr, size, dir);
  }

  // The generation of the current table: it changes with every AddRange / RemoveRange /
  // MoveRange. One atomic load: what Recorder::BeginExit stores so the exit can be resolved
  // later, off the hot path, against the table that was current when it happened.
  uint32_t generation() const noexcept {
    return table_.load(std::memory_order_acquire)->generation;
  }

  // Lookup against the table of `generation` (as returned by generation() at the time of the
  // access); the current table when `generation` is unknown. Takes the mutation lock: not for
  // the hot path.
  Resolution LookupAt(uint32_t generation, IoSpace space, uint64_t addr, uint32_t size,
                      AccessDir dir = AccessDir::kNone) const noexcept;

  // The device table (a copy; not for the hot path).
  std::vector<DeviceInfo> Devices() const;
  // All ranges of both spaces, sorted by space then base.
  std::vector<RangeInfo> Ranges() const;
  size_t device_count() const noexcept;
  // Name of device `index` ("" for kUnassigned / out of range). Not for the hot path.
  std::string DeviceName(uint32_t index) const;
  // Index of the device called `name`, kNotFound otherwise.
  Result<uint32_t> FindDevice(std::string_view name) const;
  // "SQ1TDBL", "CC+2" or "" for a resolution (size = access size).
  static std::string RegisterName(const Resolution& r, uint32_t size) {
    return FormatRegister(r.map, r.reg, size);
  }

 private:
  static Resolution LookupIn(const internal::AddressTable& t, IoSpace space, uint64_t addr,
                             uint32_t size, AccessDir dir) noexcept {
    const internal::AddressTable::Space& s = t.spaces[static_cast<int>(space) & 1];
    const uint64_t* b = s.bases.data();
    size_t n = s.bases.size();
    // Last range with base <= addr (branch-light binary search).
    if (n == 0 || addr < b[0]) return {};
    size_t lo = 0;
    while (n > 1) {
      const size_t half = n / 2;
      lo = (b[lo + half] <= addr) ? lo + half : lo;
      n -= half;
    }
    if (addr > s.lasts[lo]) return {};
    Resolution r;
    r.device = s.devices[lo];
    r.offset = addr - b[lo];
    r.map = s.maps[lo];
    if (r.map != nullptr) r.reg = r.map->Resolve(r.offset, size, dir);
    return r;
  }
  Status Publish(std::unique_ptr<internal::AddressTable> next);  // requires mu_ held

  mutable std::mutex mu_;
  std::atomic<const internal::AddressTable*> table_;
  std::vector<std::unique_ptr<internal::AddressTable>> tables_;  // current + retired
};

}  // namespace exitscope
