// base/huge_pages.h: where the memory comes from changes, never what a container holds.
#include "base/huge_pages.h"

#include <cstdint>
#include <cstring>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace exitscope::base {
namespace {

TEST(HugePageAllocator, LargeBuffersLieOnHugePageBoundariesAndKeepTheirContents) {
  std::vector<uint64_t, HugePageAllocator<uint64_t>> v;
  v.reserve(kHugePage / sizeof(uint64_t) + 1);  // more than one huge page
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHugePage, 0u);
  v.resize(v.capacity());
  std::iota(v.begin(), v.end(), uint64_t{7});
  v.push_back(1);  // grows: the contents move to a new mapping
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHugePage, 0u);
  for (size_t i = 0; i + 1 < v.size(); ++i) ASSERT_EQ(v[i], 7 + i);
  EXPECT_EQ(v.back(), 1u);
}

TEST(HugePageAllocator, SmallBuffersAreOrdinaryMemory) {
  std::vector<uint8_t, HugePageAllocator<uint8_t>> v(100, 3);
  EXPECT_EQ(v.size(), 100u);
  EXPECT_EQ(v[99], 3);
}

TEST(SlotArena, SlotsAreDistinctReusedAndSizedUpToAPage) {
  EXPECT_EQ(SlotArena(0).slot(), 4096u);  // never an empty slot
  SlotArena arena(5000);
  EXPECT_EQ(arena.slot(), 8192u);
  std::set<void*> seen;
  std::vector<void*> held;
  for (int i = 0; i < 600; ++i) {  // more than one huge page of slots
    void* p = arena.Get();
    ASSERT_TRUE(seen.insert(p).second);
    std::memset(p, i & 0xff, arena.slot());
    held.push_back(p);
  }
  for (size_t i = 0; i < held.size(); ++i) {
    ASSERT_EQ(static_cast<uint8_t*>(held[i])[arena.slot() - 1], i & 0xff);
  }
  arena.Put(held.back());
  EXPECT_EQ(arena.Get(), held.back());  // given back, handed out again
  for (void* p : held) arena.Put(p);
}

TEST(SlotAllocator, BuffersUpToASlotComeFromTheArenaLargerOnesFromTheHeap) {
  SlotArena arena(64 << 10);
  std::vector<uint32_t, SlotAllocator<uint32_t>> v{SlotAllocator<uint32_t>(&arena)};
  v.reserve(1000);
  void* first = v.data();
  for (uint32_t i = 0; i < 100000; ++i) v.push_back(i);  // outgrows the slot
  for (uint32_t i = 0; i < 100000; ++i) ASSERT_EQ(v[i], i);
  v.clear();
  v.shrink_to_fit();
  // The slots the vector had while it fit went back to the arena (two took turns).
  void* a = arena.Get();
  void* b = arena.Get();
  EXPECT_TRUE(a == first || b == first);
  arena.Put(a);
  arena.Put(b);
  std::vector<uint32_t, SlotAllocator<uint32_t>> plain;  // no arena: the heap
  plain.assign(10, 4);
  EXPECT_EQ(plain[9], 4u);
}

TEST(SlotArena, ThreadsTakeAndGiveBackConcurrently) {
  SlotArena arena(16 << 10);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&arena, t] {
      for (int i = 0; i < 2000; ++i) {
        auto* p = static_cast<uint8_t*>(arena.Get());
        p[0] = static_cast<uint8_t>(t);
        p[arena.slot() - 1] = static_cast<uint8_t>(t);
        EXPECT_EQ(p[0], p[arena.slot() - 1]);
        arena.Put(p);
      }
    });
  }
  for (auto& th : threads) th.join();
}

}  // namespace
}  // namespace exitscope::base
