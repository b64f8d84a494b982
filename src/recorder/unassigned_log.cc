// UnassignedAccessLog: a fixed-capacity, lock-free "seen" set of guest addresses.
#include "exitscope/unassigned_log.h"

#include <algorithm>

#include "base/hash.h"

namespace exitscope {

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
  const uint64_t h = base::SplitMix64(addr);
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
