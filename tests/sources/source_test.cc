// sources/source.h: OpenSource sniffs a file once and feeds one EventSink; each event says
// which side saw it; the kernel trace source pairs as KvmInput + KvmPairer do.
#include "sources/source.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"

namespace exitscope::sources {
namespace {

std::string Data(const char* rel) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/" + rel;
}

struct Counting : EventSink {
  uint64_t exits = 0, vmm = 0, kernel = 0, device_events = 0, findings = 0, timed_ns = 0;
  void OnExit(const ExitEvent& e) override {
    ++exits;
    (e.side == Side::kVmm ? vmm : kernel) += 1;
    if (e.end == ExitEnd::kSeen) timed_ns += e.duration_ns;
  }
  void OnDeviceEvent(const DeviceEvent&) override { ++device_events; }
  void OnFinding(const Finding&) override { ++findings; }
};

TEST(Source, ADumpIsTheVmmsSideWithItsDump) {
  auto src = OpenSource(Data("kvm-host/blk-backend-delay.esdump"), {});
  ASSERT_TRUE(src) << src.error().message;
  EXPECT_EQ((*src)->info().format, "recorder dump");
  EXPECT_EQ((*src)->info().side, Side::kVmm);
  ASSERT_NE((*src)->dump(), nullptr);
  EXPECT_EQ((*src)->pairing(), nullptr);
  Counting c;
  ASSERT_TRUE((*src)->Run(&c));
  uint64_t want = 0;
  for (const DumpVcpu& v : (*src)->dump()->vcpus) want += v.exits.size() + (v.in_progress ? 1 : 0);
  EXPECT_EQ(c.exits, want);
  EXPECT_EQ(c.vmm, want);
  EXPECT_EQ(c.kernel, 0u);
  EXPECT_EQ(c.device_events, (*src)->dump()->device_events.size());
  EXPECT_EQ(c.findings, (*src)->dump()->findings.size());
}

// The same exits as the KvmInput -> KvmPairer chain the commands used to wire by hand.
TEST(Source, AKernelTraceIsPairedAsKvmInputAndKvmPairerPairIt) {
  for (const char* f : {"kvm-host/joint-blk.dat", "kvm/pvm-user64-pio-mmio-hlt.txt"}) {
    SCOPED_TRACE(f);
    auto src = OpenSource(Data(f), {});
    ASSERT_TRUE(src) << src.error().message;
    EXPECT_EQ((*src)->info().side, Side::kKernel);
    EXPECT_EQ((*src)->dump(), nullptr);
    Counting c;
    ASSERT_TRUE((*src)->Run(&c));
    EXPECT_GT(c.exits, 0u);
    EXPECT_EQ(c.vmm, 0u);
    ASSERT_NE((*src)->pairing(), nullptr);
    EXPECT_EQ((*src)->pairing()->exits, c.exits);

    auto in = KvmInput::Open(Data(f), {});
    ASSERT_TRUE(in);
    Counting d;
    KvmPairer pairer({.clock = (*in)->scale()}, &d);
    ASSERT_TRUE((*in)->ReadAll(&pairer));
    EXPECT_EQ(c.exits, d.exits);
    EXPECT_EQ(c.timed_ns, d.timed_ns);
    EXPECT_EQ((*src)->info().format, (*in)->format_name());
    EXPECT_EQ((*src)->info().clock, (*in)->clock());
  }
}

TEST(Source, RawClockKeepsTheTracesTicks) {
  SourceOptions raw;
  raw.raw_clock = true;
  auto a = OpenSource(Data("kvm-host/joint-blk.dat"), raw);
  auto b = OpenSource(Data("kvm-host/joint-blk.dat"), {});
  ASSERT_TRUE(a && b);
  ASSERT_EQ((*a)->info().clock, "x86-tsc");
  Counting ca, cb;
  ASSERT_TRUE((*a)->Run(&ca));
  ASSERT_TRUE((*b)->Run(&cb));
  EXPECT_EQ(ca.exits, cb.exits);
  EXPECT_NE(ca.timed_ns, cb.timed_ns);  // ticks, not ns
}

TEST(Source, WhatIsNotAFileIsRefusedInOneLine) {
  auto dir = OpenSource(std::filesystem::temp_directory_path().string(), {});
  ASSERT_FALSE(dir);
  EXPECT_NE(dir.error().message.find("is a directory, not a regular file"), std::string::npos);
  auto dev = OpenSource("/dev/zero", {});
  ASSERT_FALSE(dev);
  EXPECT_NE(dev.error().message.find("not a regular file"), std::string::npos);
  auto none = OpenSource("/nonexistent/x.dat", {});
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, ErrorCode::kNotFound);
}

TEST(Source, AKernelTraceOnlyRefusesADumpNamingTheCommandThatReadsIt) {
  auto src = OpenKernelTrace(Data("kvm-host/joint-blk.esdump"), {});
  ASSERT_FALSE(src);
  EXPECT_NE(src.error().message.find("exitscope inspect"), std::string::npos)
      << src.error().message;
}

TEST(Source, ADumpInMemoryIsASourceToo) {
  auto d = ReadDump(Data("kvm-host/hello-lsr-delay.esdump"));
  ASSERT_TRUE(d);
  auto src = DumpAsSource(*d, "live snapshot");
  EXPECT_EQ(src->info().name, "live snapshot");
  EXPECT_EQ(src->dump(), &*d);
  Counting c;
  ASSERT_TRUE(src->Run(&c));
  EXPECT_EQ(c.vmm, c.exits);
  EXPECT_GT(c.exits, 0u);
}

}  // namespace
}  // namespace exitscope::sources
