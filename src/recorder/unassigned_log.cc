// UnassignedAccessLog: a fixed-capacity, lock-free "seen" set of guest addresses.
#include "exitscope/unassigned_log.h"

#include <algorithm>

namespace exitscope {
namespace {
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

UnassignedAccessLog::UnassignedAccessLog(uint32_t capacity) {
  uint32_t n = kProbe;
  while (n < capacity && n < (1u << 30)) n <<= 1;
  mask_ = n - 1;
  for (auto& s : slots_) {
    s.reset(new std::atomic<uint64_t>[n]);
    for (uint32_t i = 0; i < n; ++i) s[i].store(0, std::memory_order_relaxed);
  }
}

bool UnassignedAccessLog::FirstTime(IoSpace space, uint64_t addr) noexcept {
  accesses_.fetch_add(1, std::memory_order_relaxed);
  const int si = static_cast<int>(space) & 1;
  if (addr == ~0ull) {  // the one address whose addr + 1 would be the empty marker
    const bool first = !max_addr_seen_[si].exchange(true, std::memory_order_relaxed);
    if (first) remembered_.fetch_add(1, std::memory_order_relaxed);
    return first;
  }
  const uint64_t key = addr + 1;
  std::atomic<uint64_t>* t = slots_[si].get();
  const uint64_t h = Mix(addr);
  for (int i = 0; i < kProbe; ++i) {
    std::atomic<uint64_t>& s = t[(h + static_cast<uint64_t>(i)) & mask_];
    uint64_t v = s.load(std::memory_order_relaxed);
    if (v == key) return false;
    if (v == 0) {
      if (s.compare_exchange_strong(v, key, std::memory_order_relaxed)) {
        remembered_.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
      if (v == key) return false;  // another vCPU remembered it first
    }
  }
  overflow_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace exitscope
