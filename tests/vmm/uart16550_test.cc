// 16550 register semantics, driven directly.
#include "vmm/devices/uart16550.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace exitscope::vmm {
namespace {

uint8_t Rd(Uart16550& u, uint64_t off) {
  AccessContext ctx;
  uint8_t v = 0x5a;
  EXPECT_TRUE(u.Read(off, &v, 1, ctx));
  return v;
}
void Wr(Uart16550& u, uint64_t off, uint8_t v) {
  AccessContext ctx;
  EXPECT_TRUE(u.Write(off, &v, 1, ctx));
}

TEST(Uart16550, TransmitterIsAlwaysReadyAndBytesReachTheOutputPerLine) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  Uart16550 u(out);
  EXPECT_EQ(Rd(u, 5), 0x60);  // THRE | TEMT, no data ready
  for (char c : std::string("hi\nthere")) Wr(u, 0, static_cast<uint8_t>(c));
  std::fflush(out);
  EXPECT_EQ(std::ftell(out), 3);  // the complete line only
  std::rewind(out);
  char buf[8] = {};
  ASSERT_EQ(std::fread(buf, 1, 3, out), 3u);
  EXPECT_STREQ(buf, "hi\n");
  EXPECT_EQ(u.output(), "hi\nthere");
  std::fclose(out);
}

TEST(Uart16550, DlabSwitchesOffsetsZeroAndOneToTheDivisor) {
  Uart16550 u(nullptr);
  Wr(u, 1, 0x05);  // IER
  Wr(u, 3, 0x83);  // DLAB + 8N1
  Wr(u, 0, 0x01);  // DLL
  Wr(u, 1, 0x00);  // DLM
  EXPECT_EQ(Rd(u, 0), 0x01);
  EXPECT_EQ(Rd(u, 1), 0x00);
  EXPECT_EQ(u.divisor(), 1);
  Wr(u, 3, 0x03);
  EXPECT_EQ(Rd(u, 1), 0x05);  // IER again
  EXPECT_EQ(Rd(u, 3), 0x03);
  EXPECT_EQ(u.output(), "");  // the DLL write was not data
}

TEST(Uart16550, ScratchRegisterHoldsItsValue) {
  Uart16550 u(nullptr);
  Wr(u, 7, 0xa5);
  EXPECT_EQ(Rd(u, 7), 0xa5);
}

TEST(Uart16550, IirReportsFifoAndThreInterruptUntilRead) {
  Uart16550 u(nullptr);
  EXPECT_EQ(Rd(u, 2), 0x01);  // no interrupt, no FIFO
  Wr(u, 2, 0x07);             // FCR: enable + clear FIFOs
  EXPECT_EQ(Rd(u, 2) & 0xc0, 0xc0);
  Wr(u, 1, 0x02);                    // IER: THRE interrupt
  EXPECT_EQ(Rd(u, 2) & 0x0f, 0x02);  // THR empty pending ...
  EXPECT_EQ(Rd(u, 2) & 0x0f, 0x01);  // ... cleared by reading IIR
  Wr(u, 0, 'x');
  EXPECT_EQ(Rd(u, 2) & 0x0f, 0x02);  // pending again after a write
}

TEST(Uart16550, LoopbackFeedsTransmittedBytesBack) {
  Uart16550 u(nullptr);
  Wr(u, 4, 0x10 | 0x0b);  // loopback, OUT2, RTS, DTR
  Wr(u, 0, 'A');
  EXPECT_EQ(Rd(u, 5) & 0x01, 0x01);  // data ready
  EXPECT_EQ(Rd(u, 0), 'A');
  EXPECT_EQ(Rd(u, 5) & 0x01, 0x00);
  EXPECT_EQ(u.output(), "");
  EXPECT_EQ(Rd(u, 6) & 0xb0, 0xb0);  // CTS, DSR, DCD mirror RTS, DTR, OUT2
}

TEST(Uart16550, NonByteAccessesAndOffsetsPastTheRangeAreNotRegisters) {
  Uart16550 u(nullptr);
  AccessContext ctx;
  uint8_t d[4] = {};
  EXPECT_FALSE(u.Read(0, d, 2, ctx));
  EXPECT_FALSE(u.Write(5, d, 4, ctx));
  EXPECT_FALSE(u.Read(8, d, 1, ctx));
}

}  // namespace
}  // namespace exitscope::vmm
