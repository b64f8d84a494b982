#include "exitscope/address_space.h"

#include <gtest/gtest.h>

#include <random>

namespace exitscope {
namespace {

TEST(AddressSpaceTest, LookupEdges) {
  AddressSpace as;
  auto nvme = as.AddDevice({.name = "nvme0", .kind = "nvme"});
  ASSERT_TRUE(nvme.has_value());
  auto map = RegisterMap::Builtin("nvme");
  ASSERT_TRUE(map.has_value());
  ASSERT_TRUE(as.AddRange(IoSpace::kMmio, 0xfebf0000, 0x4000, *nvme, *map).has_value());

  // First byte, last byte, one before, one past.
  Resolution r = as.Lookup(IoSpace::kMmio, 0xfebf0000, 8, AccessDir::kRead);
  EXPECT_TRUE(r.assigned());
  EXPECT_EQ(r.device, *nvme);
  EXPECT_EQ(r.offset, 0u);
  EXPECT_EQ(AddressSpace::RegisterName(r, 8), "CAP");
  r = as.Lookup(IoSpace::kMmio, 0xfebf3fff, 1, AccessDir::kWrite);
  EXPECT_TRUE(r.assigned());
  EXPECT_EQ(r.offset, 0x3fffu);
  EXPECT_FALSE(as.Lookup(IoSpace::kMmio, 0xfebeffff, 1).assigned());
  EXPECT_FALSE(as.Lookup(IoSpace::kMmio, 0xfebf4000, 1).assigned());
  EXPECT_EQ(as.Lookup(IoSpace::kMmio, 0xfebf4000, 1).device, kUnassigned);
  // The same address in the other space is unassigned.
  EXPECT_FALSE(as.Lookup(IoSpace::kPio, 0xfebf0000 & 0xffff, 1).assigned());
  // Extremes of the address space.
  EXPECT_FALSE(as.Lookup(IoSpace::kMmio, 0, 1).assigned());
  EXPECT_FALSE(as.Lookup(IoSpace::kMmio, ~0ull, 1).assigned());

  r = as.Lookup(IoSpace::kMmio, 0xfebf1008, 4, AccessDir::kWrite);
  EXPECT_EQ(AddressSpace::RegisterName(r, 4), "SQ1TDBL");
  EXPECT_EQ(as.DeviceName(r.device), "nvme0");
}

TEST(AddressSpaceTest, RangeAtTopOfSpaceAndPio) {
  AddressSpace as;
  const uint32_t d = *as.AddDevice({.name = "top", .kind = "x"});
  ASSERT_TRUE(as.AddRange(IoSpace::kMmio, ~0ull - 0xfff, 0x1000, d).has_value());
  EXPECT_TRUE(as.Lookup(IoSpace::kMmio, ~0ull, 1).assigned());
  EXPECT_FALSE(as.AddRange(IoSpace::kMmio, ~0ull - 0xfff, 0x1001, d).has_value());  // wraps
  const uint32_t com = *as.AddDevice({.name = "com1", .kind = "uart16550"});
  ASSERT_TRUE(
      as.AddRange(IoSpace::kPio, 0x3f8, 8, com, *RegisterMap::Builtin("uart16550")).has_value());
  Resolution r = as.Lookup(IoSpace::kPio, 0x3f8, 1, AccessDir::kWrite);
  EXPECT_EQ(AddressSpace::RegisterName(r, 1), "THR");
  r = as.Lookup(IoSpace::kPio, 0x3ff, 1, AccessDir::kRead);
  EXPECT_EQ(AddressSpace::RegisterName(r, 1), "SCR");
  EXPECT_FALSE(as.Lookup(IoSpace::kPio, 0x400, 1).assigned());
  auto bad = as.AddRange(IoSpace::kPio, 0xfff8, 0x10, com);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("0xffff"), std::string::npos);
  EXPECT_FALSE(as.AddRange(IoSpace::kPio, 0x500, 0, com).has_value());
}

TEST(AddressSpaceTest, OverlapRefusedNamingBoth) {
  AddressSpace as;
  const uint32_t a = *as.AddDevice({.name = "nvme0", .kind = "nvme"});
  const uint32_t b = *as.AddDevice({.name = "nvme1", .kind = "nvme"});
  ASSERT_TRUE(as.AddRange(IoSpace::kMmio, 0x1000, 0x1000, a).has_value());
  for (auto [base, size] : {std::pair<uint64_t, uint64_t>{0x1000, 0x1000},
                            {0x1fff, 1},
                            {0x800, 0x801},
                            {0x0, 0x10000},
                            {0x1800, 0x10}}) {
    auto s = as.AddRange(IoSpace::kMmio, base, size, b);
    ASSERT_FALSE(s.has_value()) << std::hex << base;
    EXPECT_EQ(s.error().code, ErrorCode::kAlreadyExists);
    EXPECT_NE(s.error().message.find("nvme1"), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find("nvme0"), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find("[0x1000, 0x1fff]"), std::string::npos) << s.error().message;
  }
  // Adjacent on both sides is fine.
  EXPECT_TRUE(as.AddRange(IoSpace::kMmio, 0x2000, 0x10, b).has_value());
  EXPECT_TRUE(as.AddRange(IoSpace::kMmio, 0x0, 0x1000, b).has_value());
  // Same range in the other space is fine.
  EXPECT_TRUE(as.AddRange(IoSpace::kPio, 0x1000, 0x1000, b).has_value());
  // Duplicate device names and bad indices are refused.
  EXPECT_EQ(as.AddDevice({.name = "nvme0", .kind = "nvme"}).error().code,
            ErrorCode::kAlreadyExists);
  EXPECT_EQ(as.AddDevice({.name = "", .kind = "nvme"}).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(as.AddDevice({.name = "a b", .kind = "nvme"}).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_FALSE(as.AddRange(IoSpace::kMmio, 0x9000, 0x10, 99).has_value());
}

TEST(AddressSpaceTest, RemoveAndMove) {
  AddressSpace as;
  const uint32_t a = *as.AddDevice({.name = "a", .kind = "x"});
  const uint32_t b = *as.AddDevice({.name = "b", .kind = "x"});
  ASSERT_TRUE(as.AddRange(IoSpace::kMmio, 0x1000, 0x100, a).has_value());
  ASSERT_TRUE(as.AddRange(IoSpace::kMmio, 0x3000, 0x100, b).has_value());
  auto mv = as.MoveRange(IoSpace::kMmio, 0x1000, 0x30f0);  // would overlap b
  ASSERT_FALSE(mv.has_value());
  EXPECT_TRUE(as.Lookup(IoSpace::kMmio, 0x1000, 1).assigned());  // unchanged
  ASSERT_TRUE(as.MoveRange(IoSpace::kMmio, 0x1000, 0x5000).has_value());
  EXPECT_FALSE(as.Lookup(IoSpace::kMmio, 0x1000, 1).assigned());
  EXPECT_EQ(as.Lookup(IoSpace::kMmio, 0x50ff, 1).device, a);
  ASSERT_TRUE(as.RemoveRange(IoSpace::kMmio, 0x5000).has_value());
  EXPECT_FALSE(as.Lookup(IoSpace::kMmio, 0x5000, 1).assigned());
  EXPECT_EQ(as.RemoveRange(IoSpace::kMmio, 0x5000).error().code, ErrorCode::kNotFound);
  // Device indices stay stable after ranges go.
  EXPECT_EQ(as.DeviceName(a), "a");
  EXPECT_EQ(*as.FindDevice("b"), b);
}

TEST(AddressSpaceTest, HundredsOfDevicesMatchLinearScan) {
  AddressSpace as;
  std::mt19937_64 rng(42);
  struct R {
    uint64_t base, size;
    uint32_t dev;
  };
  std::vector<R> ranges;
  uint64_t next = 0x10000;
  for (int i = 0; i < 600; ++i) {
    const uint32_t d = *as.AddDevice({.name = "dev" + std::to_string(i), .kind = "x"});
    next += (rng() % 4) * 0x1000;  // gaps of 0..3 pages
    const uint64_t size = 0x1000 * (1 + rng() % 4);
    ranges.push_back({next, size, d});
    next += size;
  }
  std::shuffle(ranges.begin(), ranges.end(), rng);  // registration order must not matter
  for (const R& r : ranges)
    ASSERT_TRUE(as.AddRange(IoSpace::kMmio, r.base, r.size, r.dev).has_value());
  EXPECT_EQ(as.device_count(), 600u);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t addr = rng() % (next + 0x2000);
    uint32_t want = kUnassigned;
    uint64_t off = 0;
    for (const R& r : ranges) {
      if (addr >= r.base && addr < r.base + r.size) {
        want = r.dev;
        off = addr - r.base;
      }
    }
    const Resolution got = as.Lookup(IoSpace::kMmio, addr, 4);
    ASSERT_EQ(got.device, want) << std::hex << addr;
    if (want != kUnassigned) {
      ASSERT_EQ(got.offset, off);
    }
  }
}

}  // namespace
}  // namespace exitscope
