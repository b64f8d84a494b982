// UnassignedAccessLog: a guest scanning addresses cannot grow it, each remembered address is
// logged once, and what could not be remembered is counted.
#include "exitscope/unassigned_log.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace exitscope {
namespace {

TEST(UnassignedAccessLog, OncePerAddressAndSpace) {
  UnassignedAccessLog log(64);
  EXPECT_TRUE(log.FirstTime(IoSpace::kMmio, 0xdead0000));
  EXPECT_FALSE(log.FirstTime(IoSpace::kMmio, 0xdead0000));
  EXPECT_TRUE(log.FirstTime(IoSpace::kPio, 0xdead0000));  // the other space is another address
  EXPECT_TRUE(log.FirstTime(IoSpace::kMmio, 0));
  EXPECT_FALSE(log.FirstTime(IoSpace::kMmio, 0));
  EXPECT_TRUE(log.FirstTime(IoSpace::kMmio, ~0ull));
  EXPECT_FALSE(log.FirstTime(IoSpace::kMmio, ~0ull));
  EXPECT_EQ(log.accesses(), 7u);
  EXPECT_EQ(log.remembered(), 4u);
  EXPECT_EQ(log.overflow(), 0u);
}

TEST(UnassignedAccessLog, AScanOfAMillionAddressesStaysWithinCapacity) {
  UnassignedAccessLog log(1024);
  uint64_t logged = 0;
  constexpr uint64_t kScan = 1'000'000;
  for (uint64_t a = 0; a < kScan; ++a) logged += log.FirstTime(IoSpace::kMmio, 0xe0000000 + 4 * a);
  EXPECT_LE(logged, log.capacity());
  EXPECT_EQ(logged, log.remembered());
  EXPECT_EQ(log.accesses(), kScan);
  EXPECT_EQ(log.remembered() + log.overflow(), kScan);  // every access is accounted for
  // A second pass logs nothing more.
  for (uint64_t a = 0; a < kScan; ++a)
    EXPECT_FALSE(log.FirstTime(IoSpace::kMmio, 0xe0000000 + 4 * a));
}

TEST(UnassignedAccessLog, ConcurrentVcpusLogEachAddressOnce) {
  UnassignedAccessLog log(4096);
  std::atomic<uint64_t> logged{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (uint64_t a = 0; a < 2000; ++a) logged += log.FirstTime(IoSpace::kPio, a);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(logged.load(), log.remembered());
  EXPECT_EQ(log.accesses(), 8000u);
}

}  // namespace
}  // namespace exitscope
