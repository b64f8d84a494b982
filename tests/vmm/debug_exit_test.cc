// The debug-exit device protocol (guests/abi.h).
#include "vmm/devices/debug_exit.h"

#include <gtest/gtest.h>

#include "guests/abi.h"

namespace exitscope::vmm {
namespace {

TEST(DebugExit, ExitWriteFinishesTheVcpuWithItsCode) {
  DebugExit d;
  AccessContext ctx;
  ctx.vcpu = 3;
  uint8_t v[4];
  StoreLe(4, v, 4);
  ASSERT_TRUE(d.Write(ES_DEBUG_EXIT - ES_DEBUG_PORT, v, 4, ctx));
  EXPECT_EQ(ctx.request, VcpuRequest::kFinish);
  EXPECT_EQ(ctx.code, 4u);
}

TEST(DebugExit, FaultWriteIsFatalWithTheVector) {
  DebugExit d;
  AccessContext ctx;
  uint8_t v[4];
  StoreLe(13, v, 4);
  ASSERT_TRUE(d.Write(ES_DEBUG_FAULT - ES_DEBUG_PORT, v, 4, ctx));
  EXPECT_EQ(ctx.request, VcpuRequest::kFault);
  EXPECT_EQ(ctx.code, 13u);
}

TEST(DebugExit, MarkersReachTheHookAndAreCounted) {
  uint32_t seen_vcpu = 99, seen_value = 0;
  DebugExit d([&](uint32_t vcpu, uint32_t value) {
    seen_vcpu = vcpu;
    seen_value = value;
  });
  AccessContext ctx;
  ctx.vcpu = 1;
  uint8_t v[4];
  StoreLe(0x01000064, v, 4);
  ASSERT_TRUE(d.Write(ES_DEBUG_MARKER - ES_DEBUG_PORT, v, 4, ctx));
  EXPECT_EQ(ctx.request, VcpuRequest::kNone);
  EXPECT_EQ(seen_vcpu, 1u);
  EXPECT_EQ(seen_value, 0x01000064u);
  EXPECT_EQ(d.markers(), 1u);
}

TEST(DebugExit, InfoReadsTheMagicAndOtherAccessesAreNotRegisters) {
  DebugExit d;
  AccessContext ctx;
  uint8_t v[4] = {};
  ASSERT_TRUE(d.Read(ES_DEBUG_INFO - ES_DEBUG_PORT, v, 4, ctx));
  EXPECT_EQ(LoadLe(v, 4), ES_DEBUG_MAGIC);
  EXPECT_FALSE(d.Read(0, v, 4, ctx));    // EXIT is write-only
  EXPECT_FALSE(d.Write(0, v, 1, ctx));   // wrong width
  EXPECT_FALSE(d.Write(2, v, 4, ctx));   // not a register start
  EXPECT_FALSE(d.Write(12, v, 4, ctx));  // INFO is read-only
  EXPECT_EQ(ctx.request, VcpuRequest::kNone);
}

}  // namespace
}  // namespace exitscope::vmm
