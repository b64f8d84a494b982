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
// atomic pointer store; Lookup sees the old or the new table, never a mix.
//
// Reclamation: a table that is no longer current is freed as soon as no reader can still
// hold it, so the memory is that of the current table (32 bytes per range + the device table)
// and not one table per mutation. A reader (Lookup and the other lock-free calls) announces
// itself for the few nanoseconds it reads the table: it adds 1 to one of two counters (which
// one: the reader epoch's parity), in one of 16 cache-line shards (which one: a hash of its
// stack address, so vCPU threads rarely share a line), then loads the table pointer, and
// subtracts 1 when it is done. No lock, no allocation, no syscall: two atomic additions.
// After publishing, the mutation flips the epoch (new readers count in the other counter)
// and looks at both counters of every shard: a retired table is freed once each of the two
// counters has been seen at zero after it was replaced (a reader that could hold it counted
// itself before the replacement, so a zero seen after it means that reader has left). A
// counter still busy (a vCPU in the middle of a lookup) postpones the free to a later
// mutation or LookupAt; the AddressSpace frees the rest when it is destroyed. Readers never
// wait. A mutation spins a few pauses for the draining counter; only when more than
// kRetainedTables (8) replaced tables are waiting does it yield, for kReaderWait (10 ms) at
// most, to a reader the scheduler preempted inside a lookup, so memory stays bounded without
// a mutation ever hanging on a stopped thread.
//
// Generations: BeginExit stores generation() and the exit is resolved later with LookupAt
// against the table of that generation. Old tables are not kept for that: ranges are never
// changed in place, only added (with the generation that added them) and removed or moved
// (the old range goes to a history with the generation that retired it). LookupAt of an old
// generation finds the range alive then: in the current table if it was added by then, else
// in the history. The history costs about 40 bytes per range ever removed or moved and
// nothing for a range that stays. RegisterMaps are shared, not copied, and kept (once each)
// for the life of the AddressSpace, so a Resolution's map pointer stays valid.
//
// Bulk loads: AddDevice and AddRange each build a whole new table (O(ranges) time), fine for
// a VMM's handful of devices and BAR moves. A device map of thousands of ranges is loaded
// through a Batch, which checks each addition as AddDevice / AddRange do (same errors, in
// O(log n)) and publishes one table, one generation, at Commit:
//
//   exitscope::AddressSpace::Batch b = as.BeginBatch();
//   for (const Line& l : lines) {
//     uint32_t dev = b.FindDevice(l.name) ? *b.FindDevice(l.name) : *b.AddDevice({l.name});
//     if (auto st = b.AddRange(exitscope::IoSpace::kMmio, l.base, l.size, dev); !st) ...;
//   }
//   (void)as.Commit(std::move(b));   // one table: O(n log n) time, O(n) memory
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
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
    std::vector<const RegisterMap*> maps;  // owned by AddressSpace::maps_
    std::vector<uint32_t> born;            // generation that added the range (LookupAt)
  };
  Space spaces[2];
  std::vector<DeviceInfo> devices;
  uint32_t generation = 0;  // 0 = the first table, + 1 per published mutation
};

// The reader counters of an AddressSpace (see "Reclamation" above): per shard, one counter
// per epoch parity, alone on its cache line.
struct alignas(64) ReaderShard {
  std::atomic<uint64_t> active[2] = {};
};
inline constexpr unsigned kReaderShards = 16;

// A range retired by RemoveRange / MoveRange, kept so that LookupAt of a generation in
// [born, died) still finds it.
struct RetiredRange {
  uint64_t base = 0;
  uint64_t last = 0;
  const RegisterMap* map = nullptr;
  uint32_t device = 0;
  uint32_t born = 0;
  uint32_t died = 0;  // the generation that removed it
  uint8_t space = 0;
};
}  // namespace internal

class EXITSCOPE_EXPORT AddressSpace {
 public:
  class Batch;

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

  // A bulk load starting from the current devices and ranges (a copy, taken now). Its
  // additions are checked as they come, against everything before them; none is visible
  // until Commit publishes them all as one table (one generation). Commit refuses
  // (kUnavailable, nothing changes) a batch begun before another mutation was published, and
  // (kInvalidArgument) one begun on another AddressSpace.
  Batch BeginBatch() const;
  Status Commit(Batch&& batch);

  // Resolves an access. noexcept, lock-free, no allocation; O(log ranges).
  Resolution Lookup(IoSpace space, uint64_t addr, uint32_t size,
                    AccessDir dir = AccessDir::kNone) const noexcept {
    const ReadPin pin(*this);
    return LookupIn(*pin.table(), space, addr, size, dir);
  }

  // The generation of the current table: it changes with every AddDevice / AddRange /
  // RemoveRange / MoveRange / Commit. One atomic load: what Recorder::BeginExit stores so the
  // exit can be resolved later, off the hot path, against the ranges of that generation.
  uint32_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }

  // Lookup against the ranges of `generation` (as returned by generation() at the time of the
  // access); the current table when `generation` is unknown. Takes the mutation lock: not for
  // the hot path. O(log ranges + ranges removed or moved since `generation`).
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

  // What the address space holds now, for tests and capacity planning (takes the mutation
  // lock). `bytes` counts the current table, the tables readers may still hold, the range
  // history and the map registry (not the RegisterMaps themselves).
  struct MemoryUse {
    size_t bytes = 0;
    size_t retained_tables = 0;  // tables replaced but not yet freed (a reader may hold them)
    size_t retired_ranges = 0;   // history entries (ranges removed or moved)
  };
  MemoryUse memory_use() const;

 private:
  // Announces a lock-free reader for its lifetime (see "Reclamation" above).
  class ReadPin {
   public:
    explicit ReadPin(const AddressSpace& as) noexcept {
      const unsigned parity = as.epoch_.load(std::memory_order_relaxed) & 1u;
      // Threads run on distinct stacks: the stack address picks the shard.
      const auto sp = reinterpret_cast<uintptr_t>(&parity);
      const auto shard = static_cast<unsigned>(((sp >> 12) * 0x9e3779b97f4a7c15ull) >> 60);
      counter_ = &as.readers_[shard % internal::kReaderShards].active[parity];
      counter_->fetch_add(1, std::memory_order_seq_cst);
      table_ = as.table_.load(std::memory_order_seq_cst);
    }
    ~ReadPin() { counter_->fetch_sub(1, std::memory_order_release); }
    ReadPin(const ReadPin&) = delete;
    ReadPin& operator=(const ReadPin&) = delete;
    const internal::AddressTable* table() const noexcept { return table_; }

   private:
    std::atomic<uint64_t>* counter_;
    const internal::AddressTable* table_;
  };

  // Index of the range of `s` holding `addr`, or SIZE_MAX.
  static size_t Find(const internal::AddressTable::Space& s, uint64_t addr) noexcept {
    const uint64_t* b = s.bases.data();
    size_t n = s.bases.size();
    // Last range with base <= addr (branch-light binary search).
    if (n == 0 || addr < b[0]) return SIZE_MAX;
    size_t lo = 0;
    while (n > 1) {
      const size_t half = n / 2;
      lo = (b[lo + half] <= addr) ? lo + half : lo;
      n -= half;
    }
    return addr > s.lasts[lo] ? SIZE_MAX : lo;
  }
  static Resolution Resolve(uint32_t device, const RegisterMap* map, uint64_t offset, uint32_t size,
                            AccessDir dir) noexcept {
    Resolution r;
    r.device = device;
    r.offset = offset;
    r.map = map;
    if (map != nullptr) r.reg = map->Resolve(offset, size, dir);
    return r;
  }
  static Resolution LookupIn(const internal::AddressTable& t, IoSpace space, uint64_t addr,
                             uint32_t size, AccessDir dir) noexcept {
    const internal::AddressTable::Space& s = t.spaces[static_cast<int>(space) & 1];
    const size_t i = Find(s, addr);
    if (i == SIZE_MAX) return {};
    return Resolve(s.devices[i], s.maps[i], addr - s.bases[i], size, dir);
  }
  // The following require mu_ held.
  // Owns the maps of `next` that are new, records `retired` ranges in the history, publishes
  // `next` as the current table and frees what no reader holds any more.
  Status Publish(std::unique_ptr<internal::AddressTable> next,
                 const std::vector<std::shared_ptr<const RegisterMap>>& new_maps,
                 const std::vector<internal::RetiredRange>& retired = {});
  // Frees the retired tables that no reader can hold. Past kRetainedTables waiting, waits up
  // to kReaderWait for the readers that may hold them.
  void Reclaim() const noexcept;
  // Whether the readers counted in `parity` have all left (after a short spin; with `wait`,
  // after yielding up to kReaderWait).
  bool ReadersLeft(unsigned parity, bool wait) const noexcept;
  static constexpr size_t kRetainedTables = 8;
  static constexpr std::chrono::milliseconds kReaderWait{10};
  uint32_t NextGeneration() const noexcept { return current_->generation + 1; }

  mutable std::mutex mu_;
  std::atomic<const internal::AddressTable*> table_;  // == current_.get()
  std::atomic<uint32_t> generation_{0};               // == current_->generation
  mutable std::atomic<uint32_t> epoch_{0};            // its parity picks the reader counter
  mutable internal::ReaderShard readers_[internal::kReaderShards];
  std::unique_ptr<const internal::AddressTable> current_;
  struct Retired {
    std::unique_ptr<const internal::AddressTable> table;
    unsigned seen_idle = 0;  // bit p: counters of parity p seen at zero since it was replaced
  };
  mutable std::vector<Retired> retired_tables_;
  std::vector<internal::RetiredRange> history_;  // sorted by `died`
  // Every register map ever given, once (Resolution::map stays valid): pointer -> owner.
  std::unordered_map<const RegisterMap*, std::shared_ptr<const RegisterMap>> maps_;
};

// A bulk load (AddressSpace::BeginBatch): the calls and errors of AddDevice / AddRange /
// FindDevice, applied to a private copy; nothing is visible until AddressSpace::Commit.
// O(log n) per call (a balanced tree per space and a name index), O(n) memory.
class EXITSCOPE_EXPORT AddressSpace::Batch {
 public:
  Batch(Batch&&) = default;
  Batch& operator=(Batch&&) = default;

  Result<uint32_t> AddDevice(DeviceSpec spec);
  Status AddRange(IoSpace space, uint64_t base, uint64_t size, uint32_t device,
                  std::shared_ptr<const RegisterMap> map = nullptr);
  Result<uint32_t> FindDevice(std::string_view name) const;
  size_t device_count() const noexcept { return devices_.size(); }

 private:
  friend class AddressSpace;
  Batch() = default;
  struct Range {
    uint64_t last = 0;
    uint32_t device = 0;
    uint32_t born = 0;  // kUnassigned: added by this batch
    const RegisterMap* map = nullptr;
  };
  const AddressSpace* owner_ = nullptr;  // the space BeginBatch was called on
  uint32_t base_generation_ = 0;
  bool changed_ = false;
  std::vector<DeviceInfo> devices_;
  std::unordered_map<std::string, uint32_t> names_;
  std::map<uint64_t, Range> ranges_[2];                                              // by base
  std::unordered_map<const RegisterMap*, std::shared_ptr<const RegisterMap>> maps_;  // brought
};

}  // namespace exitscope
