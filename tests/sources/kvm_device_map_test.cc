// Device maps: the text format, builtin register maps, errors with file:line, and resolution
// of the capture's ports through the pairer.
#include "sources/kvm_device_map.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "exitscope/dump.h"
#include "exitscope/recorder.h"
#include "sources/tracecmd_dat.h"

namespace exitscope::sources {
namespace {

constexpr std::string_view kMap =
    "# name kind space base length [regmap]\n"
    "com1   uart16550  pio  0x3f8 8 uart16550\n"
    "dbg    debug-exit pio  0xe9  1\n"
    "nvme0  nvme       mmio 0xfebf0000 0x4000 nvme\n"
    "nvme0  nvme       mmio 0xfebf8000 0x1000   # a second range of the same device\n"
    "\n";

TEST(KvmDeviceMap, ParsesAndResolvesPortsAndRegisters) {
  auto m = KvmDeviceMap::Parse(kMap, "test.map");
  ASSERT_TRUE(m.has_value()) << m.error().message;
  EXPECT_EQ((*m)->device_count(), 3u);
  std::string_view dev, reg;
  ASSERT_TRUE((*m)->Resolve(SubKeyKind::kPort, 0x3f8, 1, AccessDir::kWrite, &dev, &reg));
  EXPECT_EQ(dev, "com1");
  EXPECT_EQ(reg, "THR");
  ASSERT_TRUE((*m)->Resolve(SubKeyKind::kPort, 0x3f8, 1, AccessDir::kRead, &dev, &reg));
  EXPECT_EQ(reg, "RBR");
  ASSERT_TRUE((*m)->Resolve(SubKeyKind::kPort, 0x3fd, 1, AccessDir::kNone, &dev, &reg));
  EXPECT_EQ(reg, "LSR");
  ASSERT_TRUE((*m)->Resolve(SubKeyKind::kMmio, 0xfebf1008, 4, AccessDir::kNone, &dev, &reg));
  EXPECT_EQ(dev, "nvme0");
  EXPECT_EQ(reg, "SQ1TDBL");
  ASSERT_TRUE((*m)->Resolve(SubKeyKind::kMmio, 0xfebf8004, 4, AccessDir::kNone, &dev, &reg));
  EXPECT_EQ(dev, "nvme0");
  EXPECT_EQ(reg, "");
  ASSERT_TRUE((*m)->Resolve(SubKeyKind::kPort, 0xe9, 1, AccessDir::kNone, &dev, &reg));
  EXPECT_EQ(dev, "dbg");
  EXPECT_FALSE((*m)->Resolve(SubKeyKind::kPort, 0x80, 1, AccessDir::kNone, &dev, &reg));
  EXPECT_FALSE(
      (*m)->Resolve(SubKeyKind::kMmio, 0x3f8, 1, AccessDir::kNone, &dev, &reg));  // other space
  // A repeated lookup is served from the cache: the same bytes.
  std::string_view dev2, reg2, dev3, reg3;
  (*m)->Resolve(SubKeyKind::kMmio, 0xfebf1008, 4, AccessDir::kNone, &dev2, &reg2);
  (*m)->Resolve(SubKeyKind::kMmio, 0xfebf1008, 4, AccessDir::kNone, &dev3, &reg3);
  EXPECT_EQ(reg2, "SQ1TDBL");
  EXPECT_EQ(reg2.data(), reg3.data());
}

TEST(KvmDeviceMap, ErrorsNameFileAndLine) {
  const auto err = [](std::string_view text) {
    auto m = KvmDeviceMap::Parse(text, "bad.map");
    EXPECT_FALSE(m.has_value());
    return m.has_value() ? std::string() : m.error().message;
  };
  EXPECT_EQ(err("com1 uart pio 0x3f8\n").rfind("bad.map:1: expected", 0), 0u);
  EXPECT_EQ(err("\ncom1 uart port 0x3f8 8\n").rfind("bad.map:2: space must be", 0), 0u);
  EXPECT_EQ(err("com1 uart pio 0xzz 8\n").rfind("bad.map:1: bad base", 0), 0u);
  EXPECT_EQ(err("com1 uart pio 0x3f8 0\n").rfind("bad.map:1: bad length", 0), 0u);
  EXPECT_EQ(err("com1 uart pio 0x3f8 8 no-such-map\n").rfind("bad.map:1: regmap", 0), 0u);
  const std::string overlap = err("a x pio 0x3f8 8\nb x pio 0x3fc 8\n");
  EXPECT_EQ(overlap.rfind("bad.map:2: ", 0), 0u) << overlap;
}

TEST(KvmDeviceMap, LoadsFromARecorderDump) {
  // A dump written the way a VMM writes one: devices registered in the recorder's address
  // space, then Recorder::WriteDump.
  auto rec = Recorder::Create({.num_vcpus = 1, .start_watchdog = false});
  ASSERT_TRUE(rec.has_value()) << rec.error().message;
  auto com1 = (*rec)->address_space().AddDevice({.name = "com1", .kind = "uart16550"});
  ASSERT_TRUE(com1.has_value());
  auto uart = RegisterMap::Builtin("uart16550");
  ASSERT_TRUE(uart.has_value());
  ASSERT_TRUE((*rec)->address_space().AddRange(IoSpace::kPio, 0x3f8, 8, *com1, *uart).has_value());
  const std::string path =
      ::testing::TempDir() + "/kvm_device_map_test." + std::to_string(::getpid()) + ".dump";
  const Status written = (*rec)->WriteDump(path);
  ASSERT_TRUE(written.has_value()) << written.error().message;
  auto m = KvmDeviceMap::Load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  std::string_view dev, reg;
  ASSERT_TRUE((*m)->Resolve(SubKeyKind::kPort, 0x3fd, 1, AccessDir::kNone, &dev, &reg));
  EXPECT_EQ(dev, "com1");
  EXPECT_EQ(reg, "LSR");
  EXPECT_FALSE((*m)->Resolve(SubKeyKind::kPort, 0x400, 1, AccessDir::kNone, &dev, &reg));
}

TEST(KvmDeviceMap, NamesTheCapturePortsThroughThePairer) {
  const std::string dat = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/pvm-user64-pio-mmio-hlt.dat";
  ASSERT_TRUE(std::filesystem::exists(dat)) << "committed capture missing: " << dat;
  auto m = KvmDeviceMap::Parse(
      "com1 uart16550 pio 0x3f8 8 uart16550\n"
      "doorbell mmio-doorbell mmio 0xd0000 0x1000\n",
      "capture.map");
  ASSERT_TRUE(m.has_value()) << m.error().message;
  struct Sink : EventSink {
    uint64_t com1 = 0, doorbell = 0, unresolved = 0;
    void OnExit(const ExitEvent& e) override {
      if (e.device == "com1")
        ++com1;
      else if (e.device == "doorbell")
        ++doorbell;
      else if (e.subkey_kind == SubKeyKind::kPort || e.subkey_kind == SubKeyKind::kMmio)
        ++unresolved;
    }
  } sink;
  KvmPairer pairer({.devices = m->get()}, &sink);
  auto in = TraceCmdDat::Open(dat);
  ASSERT_TRUE(in.has_value());
  ASSERT_TRUE((*in)->ReadAll(&pairer).has_value());
  EXPECT_EQ(sink.com1, 3001u);  // 3001 kvm_pio on 0x3f8; the last exit is open at end of trace
  EXPECT_EQ(sink.doorbell, 3000u);
  EXPECT_EQ(sink.unresolved, 2u);  // the debug port 0xe9
}

// The pairers of a capture read in segments on threads share one map: lookups from several
// threads at once, most of them new to the cache (it grows, and rehashes, meanwhile), give
// what one thread gets. Under ThreadSanitizer in make tsan (label `concurrency`).
TEST(KvmDeviceMapThreads, ResolvesFromSeveralThreadsAtOnce) {
  const auto lookups = [](const KvmDeviceMap& m, unsigned from, unsigned step) {
    std::vector<std::string> out;
    for (unsigned i = from; i < 4096; i += step) {
      std::string_view dev, reg;
      const bool mmio = i % 2 == 0;
      const bool found = m.Resolve(mmio ? SubKeyKind::kMmio : SubKeyKind::kPort,
                                   mmio ? 0xfebf0000 + 4 * i : 0x3f0 + i % 16, 1 + i % 4,
                                   i % 3 == 0 ? AccessDir::kWrite : AccessDir::kRead, &dev, &reg);
      out.push_back(fmt::format("{} {} {} {}", i, found, dev, reg));
    }
    return out;
  };
  auto one = KvmDeviceMap::Parse(kMap, "test.map");
  auto shared = KvmDeviceMap::Parse(kMap, "test.map");
  ASSERT_TRUE(one.has_value() && shared.has_value());
  constexpr unsigned kThreads = 4;
  std::vector<std::vector<std::string>> got(kThreads);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] { got[t] = lookups(**shared, t, kThreads); });
  }
  for (std::thread& t : threads) t.join();
  for (unsigned t = 0; t < kThreads; ++t) {
    EXPECT_EQ(got[t], lookups(**one, t, kThreads)) << "thread " << t;
  }
  // Some of them are registers the map names.
  std::string_view dev, reg;
  ASSERT_TRUE((*shared)->Resolve(SubKeyKind::kMmio, 0xfebf1008, 4, AccessDir::kNone, &dev, &reg));
  EXPECT_EQ(reg, "SQ1TDBL");
}

}  // namespace
}  // namespace exitscope::sources
