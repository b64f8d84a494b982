// recorder/resolve_cache.h: a per-snapshot memo of exit resolution (device, register, map),
// so that a snapshot of millions of exits searches the address space once per distinct access
// instead of once per record. Not public API.
//
// An unresolved record's resolution is a function of (address-space generation, space,
// address, size, direction): the generation's table is immutable (address_space.h), so a
// cached answer never goes stale. The cache is direct-mapped with kSlots entries; a miss calls
// the caller's resolver and replaces the slot. Single thread (one snapshot).
#pragma once

#include <cstdint>
#include <memory>

#include "exitscope/exit_record.h"

namespace exitscope::internal {

class ResolveCache {
 public:
  // What a record resolves to; `map` is the caller's index of the register map (e.g. into
  // Dump::maps), kNoRegister when none.
  struct Value {
    uint32_t device = kUnassigned;
    uint32_t reg = kNoRegister;
    uint32_t element = 0;
    uint32_t delta = 0;
    uint32_t map = kNoRegister;
  };

  ResolveCache() : slots_(new Slot[kSlots]) {}

  // The resolution of unresolved record `r` (flags & kExitFlagUnresolved: r.device holds the
  // generation): from the cache, else resolve(const ExitRecord&) -> Value, remembered.
  template <typename Resolver>
  const Value& Get(const ExitRecord& r, Resolver&& resolve) {
    const uint64_t key = (static_cast<uint64_t>(r.device) << 32) |
                         (static_cast<uint64_t>(r.kind) << 16) |
                         (static_cast<uint64_t>(r.size) << 8) | static_cast<uint64_t>(r.dir);
    uint64_t h = (r.addr ^ (key * 0x9e3779b97f4a7c15ull)) * 0xbf58476d1ce4e5b9ull;
    Slot& s = slots_[(h >> 40) & (kSlots - 1)];
    if (!s.used || s.key != key || s.addr != r.addr) {
      s.value = resolve(r);
      s.key = key;
      s.addr = r.addr;
      s.used = true;
      ++misses_;
    }
    return s.value;
  }
  uint64_t misses() const noexcept { return misses_; }

 private:
  static constexpr uint64_t kSlots = 4096;
  struct Slot {
    uint64_t key = 0;
    uint64_t addr = 0;
    Value value;
    bool used = false;
  };
  std::unique_ptr<Slot[]> slots_;
  uint64_t misses_ = 0;
};

}  // namespace exitscope::internal
