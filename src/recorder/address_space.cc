// AddressSpace: registration (copy-on-write tables published by an atomic pointer).
#include "exitscope/address_space.h"

#include <algorithm>

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

using Space = internal::AddressTable::Space;

void Insert(Space& s, size_t at, uint64_t base, uint64_t last, uint32_t device,
            std::shared_ptr<const RegisterMap> map) {
  s.bases.insert(s.bases.begin() + static_cast<ptrdiff_t>(at), base);
  s.lasts.insert(s.lasts.begin() + static_cast<ptrdiff_t>(at), last);
  s.devices.insert(s.devices.begin() + static_cast<ptrdiff_t>(at), device);
  s.maps.insert(s.maps.begin() + static_cast<ptrdiff_t>(at), map.get());
  s.owners.insert(s.owners.begin() + static_cast<ptrdiff_t>(at), std::move(map));
}

void Erase(Space& s, size_t at) {
  const auto i = static_cast<ptrdiff_t>(at);
  s.bases.erase(s.bases.begin() + i);
  s.lasts.erase(s.lasts.begin() + i);
  s.devices.erase(s.devices.begin() + i);
  s.maps.erase(s.maps.begin() + i);
  s.owners.erase(s.owners.begin() + i);
}

}  // namespace

AddressSpace::AddressSpace() {
  tables_.push_back(std::make_unique<internal::AddressTable>());
  table_.store(tables_.back().get(), std::memory_order_release);
}

AddressSpace::~AddressSpace() = default;

Resolution AddressSpace::LookupAt(uint32_t generation, IoSpace space, uint64_t addr, uint32_t size,
                                  AccessDir dir) const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  const internal::AddressTable& t =
      generation < tables_.size() ? *tables_[generation] : *table_.load(std::memory_order_acquire);
  return LookupIn(t, space, addr, size, dir);
}

Status AddressSpace::Publish(std::unique_ptr<internal::AddressTable> next) {
  next->generation = static_cast<uint32_t>(tables_.size());
  // Take ownership first: push_back may throw (bad_alloc), and a table published before it is
  // owned would be freed under the readers. Only an owned table is ever made visible.
  tables_.push_back(std::move(next));
  table_.store(tables_.back().get(), std::memory_order_release);
  return {};
}

Result<uint32_t> AddressSpace::AddDevice(DeviceSpec spec) {
  if (!ValidDeviceName(spec.name)) {
    return Fail(ErrorCode::kInvalidArgument,
                "device name '" + spec.name + "' is not valid (1-63 of A-Z a-z 0-9 _ . : -)");
  }
  if (spec.kind.size() > 63) {
    return Fail(ErrorCode::kInvalidArgument, "device kind '" + spec.kind + "' is too long");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const internal::AddressTable* cur = table_.load(std::memory_order_relaxed);
  for (const DeviceInfo& d : cur->devices) {
    if (d.name == spec.name) {
      return Fail(ErrorCode::kAlreadyExists, "device '" + spec.name + "' is already registered");
    }
  }
  if (cur->devices.size() >= 0xfffffffeu)
    return Fail(ErrorCode::kInvalidArgument, "too many devices");
  auto next = std::make_unique<internal::AddressTable>(*cur);
  DeviceInfo info;
  info.index = static_cast<uint32_t>(next->devices.size());
  info.id = spec.id != 0 ? spec.id : info.index;
  info.name = std::move(spec.name);
  info.kind = std::move(spec.kind);
  next->devices.push_back(std::move(info));
  const uint32_t index = next->devices.back().index;
  (void)Publish(std::move(next));
  return index;
}

Status AddressSpace::AddRange(IoSpace space, uint64_t base, uint64_t size, uint32_t device,
                              std::shared_ptr<const RegisterMap> map) {
  const int si = static_cast<int>(space);
  if (si != 0 && si != 1) return Fail(ErrorCode::kInvalidArgument, "bad address space");
  if (size == 0) {
    return Fail(ErrorCode::kInvalidArgument,
                std::string(ToString(space)) + " range at " + Hex(base) + " has size 0");
  }
  const uint64_t last = base + (size - 1);
  if (last < base) {
    return Fail(ErrorCode::kInvalidArgument, std::string(ToString(space)) + " range at " +
                                                 Hex(base) + " of size " + Hex(size) +
                                                 " wraps past 2^64");
  }
  if (space == IoSpace::kPio && last > 0xffff) {
    return Fail(ErrorCode::kInvalidArgument,
                "pio range at " + Hex(base) + " of size " + Hex(size) + " ends past port 0xffff");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const internal::AddressTable* cur = table_.load(std::memory_order_relaxed);
  if (device >= cur->devices.size()) {
    return Fail(ErrorCode::kInvalidArgument,
                "device index " + std::to_string(device) + " is not registered");
  }
  const Space& s = cur->spaces[si];
  const size_t at =
      static_cast<size_t>(std::upper_bound(s.bases.begin(), s.bases.end(), base) - s.bases.begin());
  auto describe = [&](size_t i) {
    return "[" + Hex(s.bases[i]) + ", " + Hex(s.lasts[i]) + "] of " +
           cur->devices[s.devices[i]].name;
  };
  const std::string mine = std::string(ToString(space)) + " range [" + Hex(base) + ", " +
                           Hex(last) + "] of " + cur->devices[device].name;
  if (at > 0 && s.lasts[at - 1] >= base) {
    return Fail(ErrorCode::kAlreadyExists, mine + " overlaps " + describe(at - 1));
  }
  if (at < s.bases.size() && s.bases[at] <= last) {
    return Fail(ErrorCode::kAlreadyExists, mine + " overlaps " + describe(at));
  }
  auto next = std::make_unique<internal::AddressTable>(*cur);
  Insert(next->spaces[si], at, base, last, device, std::move(map));
  return Publish(std::move(next));
}

Status AddressSpace::RemoveRange(IoSpace space, uint64_t base) {
  const int si = static_cast<int>(space) & 1;
  std::lock_guard<std::mutex> lock(mu_);
  const internal::AddressTable* cur = table_.load(std::memory_order_relaxed);
  const Space& s = cur->spaces[si];
  auto it = std::lower_bound(s.bases.begin(), s.bases.end(), base);
  if (it == s.bases.end() || *it != base) {
    return Fail(ErrorCode::kNotFound,
                "no " + std::string(ToString(space)) + " range starts at " + Hex(base));
  }
  auto next = std::make_unique<internal::AddressTable>(*cur);
  Erase(next->spaces[si], static_cast<size_t>(it - s.bases.begin()));
  return Publish(std::move(next));
}

Status AddressSpace::MoveRange(IoSpace space, uint64_t old_base, uint64_t new_base) {
  const int si = static_cast<int>(space) & 1;
  std::lock_guard<std::mutex> lock(mu_);
  const internal::AddressTable* cur = table_.load(std::memory_order_relaxed);
  const Space& s = cur->spaces[si];
  auto it = std::lower_bound(s.bases.begin(), s.bases.end(), old_base);
  if (it == s.bases.end() || *it != old_base) {
    return Fail(ErrorCode::kNotFound,
                "no " + std::string(ToString(space)) + " range starts at " + Hex(old_base));
  }
  const size_t i = static_cast<size_t>(it - s.bases.begin());
  const uint64_t size = s.lasts[i] - s.bases[i] + 1;
  const uint32_t device = s.devices[i];
  std::shared_ptr<const RegisterMap> map = s.owners[i];
  const uint64_t last = new_base + (size - 1);
  if (last < new_base || (space == IoSpace::kPio && last > 0xffff)) {
    return Fail(ErrorCode::kInvalidArgument, std::string(ToString(space)) + " range moved to " +
                                                 Hex(new_base) + " would end past the space");
  }
  auto next = std::make_unique<internal::AddressTable>(*cur);
  Space& ns = next->spaces[si];
  Erase(ns, i);
  const size_t at = static_cast<size_t>(
      std::upper_bound(ns.bases.begin(), ns.bases.end(), new_base) - ns.bases.begin());
  const std::string mine = std::string(ToString(space)) + " range [" + Hex(new_base) + ", " +
                           Hex(last) + "] of " + next->devices[device].name;
  auto describe = [&](size_t k) {
    return "[" + Hex(ns.bases[k]) + ", " + Hex(ns.lasts[k]) + "] of " +
           next->devices[ns.devices[k]].name;
  };
  if (at > 0 && ns.lasts[at - 1] >= new_base) {
    return Fail(ErrorCode::kAlreadyExists, mine + " overlaps " + describe(at - 1));
  }
  if (at < ns.bases.size() && ns.bases[at] <= last) {
    return Fail(ErrorCode::kAlreadyExists, mine + " overlaps " + describe(at));
  }
  Insert(ns, at, new_base, last, device, std::move(map));
  return Publish(std::move(next));
}

std::vector<DeviceInfo> AddressSpace::Devices() const {
  return table_.load(std::memory_order_acquire)->devices;
}

std::vector<RangeInfo> AddressSpace::Ranges() const {
  const internal::AddressTable* t = table_.load(std::memory_order_acquire);
  std::vector<RangeInfo> out;
  for (int si = 0; si < 2; ++si) {
    const Space& s = t->spaces[si];
    for (size_t i = 0; i < s.bases.size(); ++i) {
      RangeInfo r;
      r.space = static_cast<IoSpace>(si);
      r.base = s.bases[i];
      r.size = s.lasts[i] - s.bases[i] + 1;
      r.device = s.devices[i];
      r.map = s.owners[i];
      out.push_back(std::move(r));
    }
  }
  return out;
}

size_t AddressSpace::device_count() const noexcept {
  return table_.load(std::memory_order_acquire)->devices.size();
}

std::string AddressSpace::DeviceName(uint32_t index) const {
  const internal::AddressTable* t = table_.load(std::memory_order_acquire);
  return index < t->devices.size() ? t->devices[index].name : std::string();
}

Result<uint32_t> AddressSpace::FindDevice(std::string_view name) const {
  const internal::AddressTable* t = table_.load(std::memory_order_acquire);
  for (const DeviceInfo& d : t->devices) {
    if (d.name == name) return d.index;
  }
  return Fail(ErrorCode::kNotFound, "no device named '" + std::string(name) + "'");
}

}  // namespace exitscope
