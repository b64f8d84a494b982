// recorder/exit_convert.h: a ring record (raw ticks, maybe unresolved) to a DumpExit (ns,
// device and register resolved), shared by Recorder::Snapshot (recorder.cc) and the streamed
// Recorder::WriteDump (dump_stream.cc). Not public API.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "exitscope/address_space.h"
#include "exitscope/clock.h"
#include "exitscope/dump.h"
#include "exitscope/exit_record.h"
#include "recorder/resolve_cache.h"

namespace exitscope::internal {

// Recorder::Resolve, also giving the register map the record was resolved in (nullptr when
// none, or when `r` was already resolved).
inline const RegisterMap* ResolveIn(const AddressSpace& space, ExitRecord* r) noexcept {
  if ((r->flags & kExitFlagUnresolved) == 0) return nullptr;
  const Resolution res = space.LookupAt(r->device, SpaceOf(r->kind), r->addr, r->size, r->dir);
  r->device = res.device;
  r->reg = res.reg.reg;
  r->reg_element = res.reg.element;
  r->reg_delta = res.reg.delta;
  r->flags &= static_cast<uint8_t>(~kExitFlagUnresolved);
  return res.map;
}

// Converts records for one snapshot into `d`. An exit names its register through the map of
// the generation it was resolved in, which a range moved since no longer has: that map joins
// d->maps (and *map_index) too. Resolution goes through a per-converter cache: millions of
// records, a few distinct accesses. One thread per converter; converters of several threads
// that share `d` and `map_index` pass the mutex that guards them (taken on a cache miss only).
class ExitConverter {
 public:
  ExitConverter(const Clock& clock, const AddressSpace& space, bool guest, Dump* d,
                std::map<const RegisterMap*, uint32_t>* map_index, std::mutex* maps_mu = nullptr)
      : clock_(clock),
        space_(space),
        guest_(guest),
        d_(d),
        map_index_(map_index),
        maps_mu_(maps_mu) {}

  void operator()(const ExitRecord& r, DumpExit* e) {
    e->start_ns = clock_.ToMonotonicNs(r.start_ticks);
    e->duration_ns = clock_.TicksToNs(r.duration_ticks);
    e->addr = r.addr;
    e->value = guest_ ? r.value : 0;
    e->vcpu = r.vcpu;
    e->kind = r.kind;
    e->size = r.size;
    e->dir = r.dir;
    e->flags = guest_ ? r.flags : static_cast<uint8_t>(r.flags & ~kExitFlagValue);
    if ((r.flags & kExitFlagUnresolved) != 0) {
      const ResolveCache::Value& v =
          cache_.Get(r, [this](const ExitRecord& u) { return Resolve(u); });
      e->device = v.device;
      e->reg = v.reg;
      e->reg_element = v.element;
      e->reg_delta = v.delta;
      e->map = v.map;
      e->flags &= static_cast<uint8_t>(~kExitFlagUnresolved);
    } else {
      e->device = r.device;
      e->reg = r.reg;
      e->reg_element = r.reg_element;
      e->reg_delta = r.reg_delta;
      e->map = kNoRegister;
    }
  }

 private:
  ResolveCache::Value Resolve(const ExitRecord& unresolved) {
    ExitRecord r = unresolved;
    const RegisterMap* map = ResolveIn(space_, &r);
    ResolveCache::Value v{r.device, r.reg, r.reg_element, r.reg_delta, kNoRegister};
    if (map != nullptr) {
      std::unique_lock<std::mutex> lock;
      if (maps_mu_ != nullptr) lock = std::unique_lock<std::mutex>(*maps_mu_);
      auto [it, inserted] = map_index_->emplace(map, static_cast<uint32_t>(d_->maps.size()));
      if (inserted) d_->maps.push_back(*map);
      v.map = it->second;
    }
    return v;
  }

  const Clock& clock_;
  const AddressSpace& space_;
  const bool guest_;
  Dump* d_;
  std::map<const RegisterMap*, uint32_t>* map_index_;
  std::mutex* maps_mu_;
  ResolveCache cache_;
};

}  // namespace exitscope::internal
