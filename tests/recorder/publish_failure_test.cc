// AddressSpace mutations under allocation failure: whatever allocation fails, the table that
// readers see stays a live, consistent one (the old one or the new one), never a freed one.
//
// This binary replaces the global operator new so that the N-th allocation from a point on
// throws std::bad_alloc; each mutation is retried with N = 0, 1, 2, ... until it succeeds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

#include "exitscope/address_space.h"

namespace {
long g_fail_after = -1;  // -1: never fail; else the number of allocations still allowed
}  // namespace

void* operator new(std::size_t n) {
  if (g_fail_after == 0) {
    g_fail_after = -1;
    throw std::bad_alloc();
  }
  if (g_fail_after > 0) --g_fail_after;
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace exitscope {
namespace {

TEST(AddressSpacePublish, AFailedMutationNeverPublishesAFreedTable) {
  AddressSpace as;
  const uint32_t dev = *as.AddDevice({.name = "dev0", .kind = "x"});
  int failures = 0;
  for (uint64_t i = 0; i < 40; ++i) {
    const uint64_t base = 0x10000 * (i + 1);
    for (long n = 0;; ++n) {
      bool ok = false;
      g_fail_after = n;
      try {
        ok = as.AddRange(IoSpace::kMmio, base, 0x1000, dev).has_value();
      } catch (const std::bad_alloc&) {
        ++failures;
      }
      g_fail_after = -1;
      // Every range added so far resolves, with the right offset, in the published table.
      for (uint64_t k = 0; k < i; ++k) {
        const Resolution r = as.Lookup(IoSpace::kMmio, 0x10000 * (k + 1) + 8, 4);
        ASSERT_EQ(r.device, dev) << "range " << k << " after failing allocation " << n;
        ASSERT_EQ(r.offset, 8u);
      }
      ASSERT_EQ(as.Ranges().size(), i + (ok ? 1 : 0)) << "allocation " << n;
      if (ok) break;
      ASSERT_FALSE(as.Lookup(IoSpace::kMmio, base, 4).assigned()) << "allocation " << n;
    }
  }
  EXPECT_GT(failures, 40);  // every step failed at least once before it succeeded
}

}  // namespace
}  // namespace exitscope
