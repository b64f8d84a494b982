// AddressSpace: registration (copy-on-write tables published by an atomic pointer, freed once
// no reader holds them; see "Reclamation" in exitscope/address_space.h) and bulk loads.
#include "exitscope/address_space.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "base/text.h"

namespace exitscope {
namespace {

using base::Hex;

bool ValidDeviceName(std::string_view n) {
  if (n.empty() || n.size() > 63) return false;
  for (char c : n) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// AddDevice's checks of a spec that do not depend on the table.
Status CheckDeviceSpec(const DeviceSpec& spec) {
  if (!ValidDeviceName(spec.name)) {
    return Fail(ErrorCode::kInvalidArgument,
                "device name '" + spec.name + "' is not valid (1-63 of A-Z a-z 0-9 _ . : -)");
  }
  if (spec.kind.size() > 63) {
    return Fail(ErrorCode::kInvalidArgument, "device kind '" + spec.kind + "' is too long");
  }
  return {};
}

// AddRange's checks of a range that do not depend on the table; *last = its last byte.
Status CheckRange(IoSpace space, uint64_t base, uint64_t size, uint64_t* last) {
  const int si = static_cast<int>(space);
  if (si != 0 && si != 1) return Fail(ErrorCode::kInvalidArgument, "bad address space");
  if (size == 0) {
    return Fail(ErrorCode::kInvalidArgument,
                std::string(ToString(space)) + " range at " + Hex(base) + " has size 0");
  }
  *last = base + (size - 1);
  if (*last < base) {
    return Fail(ErrorCode::kInvalidArgument, std::string(ToString(space)) + " range at " +
                                                 Hex(base) + " of size " + Hex(size) +
                                                 " wraps past 2^64");
  }
  if (space == IoSpace::kPio && *last > 0xffff) {
    return Fail(ErrorCode::kInvalidArgument,
                "pio range at " + Hex(base) + " of size " + Hex(size) + " ends past port 0xffff");
  }
  return {};
}

Status DeviceNotRegistered(uint32_t device) {
  return Fail(ErrorCode::kInvalidArgument,
              "device index " + std::to_string(device) + " is not registered");
}

// "mmio range [0x1000, 0x1fff] of nvme1 overlaps [0x1000, 0x1fff] of nvme0".
Status Overlap(IoSpace space, uint64_t base, uint64_t last, const std::string& device,
               uint64_t other_base, uint64_t other_last, const std::string& other_device) {
  return Fail(ErrorCode::kAlreadyExists, std::string(ToString(space)) + " range [" + Hex(base) +
                                             ", " + Hex(last) + "] of " + device + " overlaps [" +
                                             Hex(other_base) + ", " + Hex(other_last) + "] of " +
                                             other_device);
}

using Space = internal::AddressTable::Space;

void Insert(Space& s, size_t at, uint64_t base, uint64_t last, uint32_t device,
            const RegisterMap* map, uint32_t born) {
  const auto i = static_cast<ptrdiff_t>(at);
  s.bases.insert(s.bases.begin() + i, base);
  s.lasts.insert(s.lasts.begin() + i, last);
  s.devices.insert(s.devices.begin() + i, device);
  s.maps.insert(s.maps.begin() + i, map);
  s.born.insert(s.born.begin() + i, born);
}

void Erase(Space& s, size_t at) {
  const auto i = static_cast<ptrdiff_t>(at);
  s.bases.erase(s.bases.begin() + i);
  s.lasts.erase(s.lasts.begin() + i);
  s.devices.erase(s.devices.begin() + i);
  s.maps.erase(s.maps.begin() + i);
  s.born.erase(s.born.begin() + i);
}

// Room for `more` elements without reallocating later (amortised: capacity at least doubles).
template <typename T>
void Reserve(std::vector<T>& v, size_t more) {
  if (v.capacity() - v.size() < more) v.reserve(std::max(v.size() + more, 2 * v.capacity()));
}

size_t StringBytes(const std::string& s) {
  return s.capacity() > 15 ? s.capacity() + 1 : 0;  // past the small-string buffer
}

size_t TableBytes(const internal::AddressTable& t) {
  size_t n = sizeof(t);
  for (const Space& s : t.spaces) {
    n += s.bases.capacity() * sizeof(uint64_t) + s.lasts.capacity() * sizeof(uint64_t) +
         s.devices.capacity() * sizeof(uint32_t) + s.maps.capacity() * sizeof(void*) +
         s.born.capacity() * sizeof(uint32_t);
  }
  n += t.devices.capacity() * sizeof(DeviceInfo);
  for (const DeviceInfo& d : t.devices) n += StringBytes(d.name) + StringBytes(d.kind);
  return n;
}

void Pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

AddressSpace::AddressSpace() : current_(std::make_unique<internal::AddressTable>()) {
  table_.store(current_.get(), std::memory_order_seq_cst);
}

AddressSpace::~AddressSpace() = default;

Resolution AddressSpace::LookupAt(uint32_t generation, IoSpace space, uint64_t addr, uint32_t size,
                                  AccessDir dir) const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  Reclaim();
  const internal::AddressTable& cur = *current_;
  if (generation >= cur.generation) return LookupIn(cur, space, addr, size, dir);  // or unknown
  // A range of the current table added by `generation` was there then (ranges never change in
  // place); else the range alive then, if any, was removed or moved since: the history.
  const int si = static_cast<int>(space) & 1;
  const Space& s = cur.spaces[si];
  if (const size_t i = Find(s, addr); i != SIZE_MAX && s.born[i] <= generation) {
    return Resolve(s.devices[i], s.maps[i], addr - s.bases[i], size, dir);
  }
  auto it =
      std::upper_bound(history_.begin(), history_.end(), generation,
                       [](uint32_t g, const internal::RetiredRange& r) { return g < r.died; });
  for (; it != history_.end(); ++it) {
    if (it->space == si && it->born <= generation && it->base <= addr && addr <= it->last) {
      return Resolve(it->device, it->map, addr - it->base, size, dir);
    }
  }
  return {};
}

Status AddressSpace::Publish(std::unique_ptr<internal::AddressTable> next,
                             const std::vector<std::shared_ptr<const RegisterMap>>& new_maps,
                             const std::vector<internal::RetiredRange>& retired) {
  if (current_->generation >= kUnassigned - 1) {
    return Fail(ErrorCode::kUnavailable, "the address space has used all its generations");
  }
  next->generation = NextGeneration();
  // Everything that may throw (bad_alloc) comes before the store, so a failed mutation
  // publishes nothing; a map owned early is harmless.
  Reserve(retired_tables_, 1);
  Reserve(history_, retired.size());
  for (const std::shared_ptr<const RegisterMap>& m : new_maps) {
    if (m) maps_.try_emplace(m.get(), m);
  }
  history_.insert(history_.end(), retired.begin(), retired.end());  // no reallocation
  Retired old{std::move(current_), 0};
  current_ = std::move(next);
  table_.store(current_.get(), std::memory_order_seq_cst);
  generation_.store(current_->generation, std::memory_order_release);
  retired_tables_.push_back(std::move(old));  // no reallocation
  Reclaim();
  return {};
}

bool AddressSpace::ReadersLeft(unsigned parity, bool wait) const noexcept {
  const auto idle = [&] {
    for (const internal::ReaderShard& shard : readers_) {
      if (shard.active[parity].load(std::memory_order_seq_cst) != 0) return false;
    }
    return true;
  };
  // A reader is inside for a binary search: a few pauses usually see it leave.
  for (int i = 0; i < 64; ++i) {
    if (idle()) return true;
    Pause();
  }
  if (!wait) return false;
  // One the scheduler preempted inside needs its CPU back first.
  const auto deadline = std::chrono::steady_clock::now() + kReaderWait;
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
    if (idle()) return true;
  }
  return false;
}

void AddressSpace::Reclaim() const noexcept {
  if (retired_tables_.empty()) return;
  const bool wait = retired_tables_.size() > kRetainedTables;
  for (int k = 0; k < 2; ++k) {
    // New readers count in the other parity from now on, so the one they used until now
    // drains. Every table in the list was replaced before this look: a reader that may hold
    // one counted itself before the replacement, and so has left once its counter is zero.
    const uint32_t e = epoch_.load(std::memory_order_relaxed);
    epoch_.store(e + 1, std::memory_order_seq_cst);
    const unsigned parity = e & 1u;
    if (ReadersLeft(parity, wait)) {
      for (Retired& r : retired_tables_) r.seen_idle |= 1u << parity;
    }
  }
  std::erase_if(retired_tables_, [](const Retired& r) { return r.seen_idle == 3u; });
}

Result<uint32_t> AddressSpace::AddDevice(DeviceSpec spec) {
  EXITSCOPE_RETURN_IF_ERROR(CheckDeviceSpec(spec));
  std::lock_guard<std::mutex> lock(mu_);
  const internal::AddressTable& cur = *current_;
  for (const DeviceInfo& d : cur.devices) {
    if (d.name == spec.name) {
      return Fail(ErrorCode::kAlreadyExists, "device '" + spec.name + "' is already registered");
    }
  }
  if (cur.devices.size() >= 0xfffffffeu)
    return Fail(ErrorCode::kInvalidArgument, "too many devices");
  auto next = std::make_unique<internal::AddressTable>(cur);
  DeviceInfo info;
  info.index = static_cast<uint32_t>(next->devices.size());
  info.id = spec.id != 0 ? spec.id : info.index;
  info.name = std::move(spec.name);
  info.kind = std::move(spec.kind);
  next->devices.push_back(std::move(info));
  const uint32_t index = next->devices.back().index;
  EXITSCOPE_RETURN_IF_ERROR(Publish(std::move(next), {}));
  return index;
}

Status AddressSpace::AddRange(IoSpace space, uint64_t base, uint64_t size, uint32_t device,
                              std::shared_ptr<const RegisterMap> map) {
  uint64_t last = 0;
  EXITSCOPE_RETURN_IF_ERROR(CheckRange(space, base, size, &last));
  const int si = static_cast<int>(space);
  std::lock_guard<std::mutex> lock(mu_);
  const internal::AddressTable& cur = *current_;
  if (device >= cur.devices.size()) return DeviceNotRegistered(device);
  const Space& s = cur.spaces[si];
  const size_t at =
      static_cast<size_t>(std::upper_bound(s.bases.begin(), s.bases.end(), base) - s.bases.begin());
  for (const size_t k : {at - 1, at}) {
    if (k >= s.bases.size()) continue;  // at - 1 wraps when at == 0
    if (s.lasts[k] >= base && s.bases[k] <= last) {
      return Overlap(space, base, last, cur.devices[device].name, s.bases[k], s.lasts[k],
                     cur.devices[s.devices[k]].name);
    }
  }
  auto next = std::make_unique<internal::AddressTable>(cur);
  Insert(next->spaces[si], at, base, last, device, map.get(), NextGeneration());
  return Publish(std::move(next), {std::move(map)});
}

Status AddressSpace::RemoveRange(IoSpace space, uint64_t base) {
  const int si = static_cast<int>(space) & 1;
  std::lock_guard<std::mutex> lock(mu_);
  const internal::AddressTable& cur = *current_;
  const Space& s = cur.spaces[si];
  auto it = std::lower_bound(s.bases.begin(), s.bases.end(), base);
  if (it == s.bases.end() || *it != base) {
    return Fail(ErrorCode::kNotFound,
                "no " + std::string(ToString(space)) + " range starts at " + Hex(base));
  }
  const size_t i = static_cast<size_t>(it - s.bases.begin());
  const internal::RetiredRange gone{.base = s.bases[i],
                                    .last = s.lasts[i],
                                    .map = s.maps[i],
                                    .device = s.devices[i],
                                    .born = s.born[i],
                                    .died = NextGeneration(),
                                    .space = static_cast<uint8_t>(si)};
  auto next = std::make_unique<internal::AddressTable>(cur);
  Erase(next->spaces[si], i);
  return Publish(std::move(next), {}, {gone});
}

Status AddressSpace::MoveRange(IoSpace space, uint64_t old_base, uint64_t new_base) {
  const int si = static_cast<int>(space) & 1;
  std::lock_guard<std::mutex> lock(mu_);
  const internal::AddressTable& cur = *current_;
  const Space& s = cur.spaces[si];
  auto it = std::lower_bound(s.bases.begin(), s.bases.end(), old_base);
  if (it == s.bases.end() || *it != old_base) {
    return Fail(ErrorCode::kNotFound,
                "no " + std::string(ToString(space)) + " range starts at " + Hex(old_base));
  }
  const size_t i = static_cast<size_t>(it - s.bases.begin());
  const uint64_t size = s.lasts[i] - s.bases[i] + 1;
  const uint32_t device = s.devices[i];
  const uint64_t last = new_base + (size - 1);
  if (last < new_base || (space == IoSpace::kPio && last > 0xffff)) {
    return Fail(ErrorCode::kInvalidArgument, std::string(ToString(space)) + " range moved to " +
                                                 Hex(new_base) + " would end past the space");
  }
  const internal::RetiredRange gone{.base = s.bases[i],
                                    .last = s.lasts[i],
                                    .map = s.maps[i],
                                    .device = device,
                                    .born = s.born[i],
                                    .died = NextGeneration(),
                                    .space = static_cast<uint8_t>(si)};
  auto next = std::make_unique<internal::AddressTable>(cur);
  Space& ns = next->spaces[si];
  Erase(ns, i);
  const size_t at = static_cast<size_t>(
      std::upper_bound(ns.bases.begin(), ns.bases.end(), new_base) - ns.bases.begin());
  for (const size_t k : {at - 1, at}) {
    if (k >= ns.bases.size()) continue;
    if (ns.lasts[k] >= new_base && ns.bases[k] <= last) {
      return Overlap(space, new_base, last, next->devices[device].name, ns.bases[k], ns.lasts[k],
                     next->devices[ns.devices[k]].name);
    }
  }
  Insert(ns, at, new_base, last, device, gone.map, NextGeneration());
  return Publish(std::move(next), {}, {gone});
}

AddressSpace::Batch AddressSpace::BeginBatch() const {
  Batch b;
  std::lock_guard<std::mutex> lock(mu_);
  const internal::AddressTable& cur = *current_;
  b.owner_ = this;
  b.base_generation_ = cur.generation;
  b.devices_ = cur.devices;
  b.names_.reserve(b.devices_.size());
  for (const DeviceInfo& d : b.devices_) b.names_.emplace(d.name, d.index);
  for (int si = 0; si < 2; ++si) {
    const Space& s = cur.spaces[si];
    for (size_t i = 0; i < s.bases.size(); ++i) {
      b.ranges_[si].emplace_hint(b.ranges_[si].end(), s.bases[i],
                                 Batch::Range{s.lasts[i], s.devices[i], s.born[i], s.maps[i]});
    }
  }
  return b;
}

Status AddressSpace::Commit(Batch&& batch) {
  if (batch.owner_ != this) {
    return Fail(ErrorCode::kInvalidArgument, "the batch was begun on another address space");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (batch.base_generation_ != current_->generation) {
    return Fail(ErrorCode::kUnavailable,
                "the address space changed since the batch began (generation " +
                    std::to_string(batch.base_generation_) + ", now " +
                    std::to_string(current_->generation) + "): begin a new batch");
  }
  if (!batch.changed_) return {};
  const uint32_t generation = NextGeneration();
  auto next = std::make_unique<internal::AddressTable>();
  for (int si = 0; si < 2; ++si) {
    Space& ns = next->spaces[si];
    const size_t n = batch.ranges_[si].size();
    ns.bases.reserve(n);
    ns.lasts.reserve(n);
    ns.devices.reserve(n);
    ns.maps.reserve(n);
    ns.born.reserve(n);
    for (const auto& [base, r] : batch.ranges_[si]) {
      ns.bases.push_back(base);
      ns.lasts.push_back(r.last);
      ns.devices.push_back(r.device);
      ns.maps.push_back(r.map);
      ns.born.push_back(r.born == kUnassigned ? generation : r.born);
    }
  }
  next->devices = std::move(batch.devices_);
  std::vector<std::shared_ptr<const RegisterMap>> maps;
  maps.reserve(batch.maps_.size());
  for (const auto& [ptr, owner] : batch.maps_) maps.push_back(owner);
  return Publish(std::move(next), maps);
}

Result<uint32_t> AddressSpace::Batch::AddDevice(DeviceSpec spec) {
  EXITSCOPE_RETURN_IF_ERROR(CheckDeviceSpec(spec));
  if (names_.contains(spec.name)) {
    return Fail(ErrorCode::kAlreadyExists, "device '" + spec.name + "' is already registered");
  }
  if (devices_.size() >= 0xfffffffeu) return Fail(ErrorCode::kInvalidArgument, "too many devices");
  DeviceInfo info;
  info.index = static_cast<uint32_t>(devices_.size());
  info.id = spec.id != 0 ? spec.id : info.index;
  info.name = std::move(spec.name);
  info.kind = std::move(spec.kind);
  names_.emplace(info.name, info.index);
  devices_.push_back(std::move(info));
  changed_ = true;
  return devices_.back().index;
}

Result<uint32_t> AddressSpace::Batch::FindDevice(std::string_view name) const {
  // names_ has std::string keys (a name of up to 63 bytes; short ones need no allocation).
  if (auto it = names_.find(std::string(name)); it != names_.end()) return it->second;
  return Fail(ErrorCode::kNotFound, "no device named '" + std::string(name) + "'");
}

Status AddressSpace::Batch::AddRange(IoSpace space, uint64_t base, uint64_t size, uint32_t device,
                                     std::shared_ptr<const RegisterMap> map) {
  uint64_t last = 0;
  EXITSCOPE_RETURN_IF_ERROR(CheckRange(space, base, size, &last));
  if (device >= devices_.size()) return DeviceNotRegistered(device);
  std::map<uint64_t, Range>& ranges = ranges_[static_cast<int>(space)];
  const auto after = ranges.upper_bound(base);  // first range starting past `base`
  if (after != ranges.begin()) {
    const auto before = std::prev(after);
    if (before->second.last >= base) {
      return Overlap(space, base, last, devices_[device].name, before->first, before->second.last,
                     devices_[before->second.device].name);
    }
  }
  if (after != ranges.end() && after->first <= last) {
    return Overlap(space, base, last, devices_[device].name, after->first, after->second.last,
                   devices_[after->second.device].name);
  }
  const RegisterMap* raw = map.get();
  if (map) maps_.try_emplace(raw, std::move(map));
  ranges.emplace_hint(after, base, Range{last, device, kUnassigned, raw});
  changed_ = true;
  return {};
}

std::vector<DeviceInfo> AddressSpace::Devices() const {
  const ReadPin pin(*this);
  return pin.table()->devices;
}

std::vector<RangeInfo> AddressSpace::Ranges() const {
  std::lock_guard<std::mutex> lock(mu_);
  const internal::AddressTable& t = *current_;
  std::vector<RangeInfo> out;
  out.reserve(t.spaces[0].bases.size() + t.spaces[1].bases.size());
  for (int si = 0; si < 2; ++si) {
    const Space& s = t.spaces[si];
    for (size_t i = 0; i < s.bases.size(); ++i) {
      RangeInfo r;
      r.space = static_cast<IoSpace>(si);
      r.base = s.bases[i];
      r.size = s.lasts[i] - s.bases[i] + 1;
      r.device = s.devices[i];
      if (s.maps[i] != nullptr) r.map = maps_.at(s.maps[i]);
      out.push_back(std::move(r));
    }
  }
  return out;
}

size_t AddressSpace::device_count() const noexcept {
  const ReadPin pin(*this);
  return pin.table()->devices.size();
}

std::string AddressSpace::DeviceName(uint32_t index) const {
  const ReadPin pin(*this);
  const internal::AddressTable* t = pin.table();
  return index < t->devices.size() ? t->devices[index].name : std::string();
}

Result<uint32_t> AddressSpace::FindDevice(std::string_view name) const {
  {
    const ReadPin pin(*this);
    for (const DeviceInfo& d : pin.table()->devices) {
      if (d.name == name) return d.index;
    }
  }
  return Fail(ErrorCode::kNotFound, "no device named '" + std::string(name) + "'");
}

AddressSpace::MemoryUse AddressSpace::memory_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  MemoryUse u;
  u.bytes = sizeof(*this) + TableBytes(*current_) + retired_tables_.capacity() * sizeof(Retired) +
            history_.capacity() * sizeof(internal::RetiredRange) +
            maps_.bucket_count() * sizeof(void*) +
            maps_.size() * (sizeof(std::shared_ptr<const RegisterMap>) + 2 * sizeof(void*));
  for (const Retired& r : retired_tables_) u.bytes += TableBytes(*r.table);
  u.retained_tables = retired_tables_.size();
  u.retired_ranges = history_.size();
  return u;
}

}  // namespace exitscope
