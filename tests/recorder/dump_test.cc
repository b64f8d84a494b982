#include "exitscope/dump.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "exitscope/recorder.h"
#include "support/dump_bytes.h"

namespace exitscope {
namespace {

namespace fs = std::filesystem;
using test::Crc32;
using test::Le32;
using test::Le64;
using test::Put32;
using test::Put64;

void FixHeaderCrc(std::string& s) {
  Put32(s, 36, 0);
  Put32(s, 36, Crc32(std::string_view(s).substr(0, 64)));
}

class DumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("exitscope-dump-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    RecorderOptions o;
    o.num_vcpus = 3;
    o.events_per_vcpu = 64;
    o.start_watchdog = false;
    o.slow_exit.threshold_ns = 1'000'000;
    rec_ = std::move(*Recorder::Create(o));
    rec_->SetLogSink([](std::string_view) {});
    const uint32_t nvme =
        *rec_->address_space().AddDevice({.name = "nvme0", .kind = "nvme", .id = 0x0300});
    const uint32_t com = *rec_->address_space().AddDevice({.name = "com1", .kind = "uart16550"});
    (void)rec_->address_space().AddRange(IoSpace::kMmio, 0xfebf0000, 0x4000, nvme,
                                         *RegisterMap::Builtin("nvme"));
    (void)rec_->address_space().AddRange(IoSpace::kPio, 0x3f8, 8, com,
                                         *RegisterMap::Builtin("uart16550"));
    for (int i = 0; i < 100; ++i) {  // wraps vCPU 0's ring
      rec_->BeginExit(0, ExitKind::kMmio, 0xfebf1000 + 8 * (i % 4), 4, AccessDir::kWrite,
                      0x1000 + i);
      rec_->EndExit(0);
    }
    rec_->BeginExit(1, ExitKind::kPio, 0x3f8, 1, AccessDir::kWrite, 'h');
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    rec_->EndExit(1);                                                      // a slow exit -> finding
    rec_->BeginExit(2, ExitKind::kMmio, 0xfebf001c, 4, AccessDir::kRead);  // in progress
    rec_->IoSubmit(nvme, 9);
    rec_->BackendError(nvme, -5, "EIO");
    rec_->SetAttribute("vmm", "test");
    (void)rec_->SetVcpuCounter(0, "kvm.exits", 555);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::unique_ptr<Recorder> rec_;
};

TEST_F(DumpTest, RoundTripThroughFile) {
  const std::string path = (dir_ / "a.esdump").string();
  ASSERT_TRUE(rec_->WriteDump(path).has_value());
  auto d = ReadDump(path);
  ASSERT_TRUE(d.has_value()) << d.error().message;
  EXPECT_EQ(d->version, kDumpVersion);
  EXPECT_FALSE(d->includes_guest_data);
  ASSERT_EQ(d->vcpus.size(), 3u);
  EXPECT_EQ(d->vcpus[0].exits.size(), 64u);
  EXPECT_EQ(d->vcpus[0].counters.written, 100u);
  EXPECT_EQ(d->vcpus[0].counters.overwritten, 36u);
  EXPECT_EQ(d->DescribeExit(d->vcpus[0].exits.back()),
            "exit MMIO write 4B to nvme0.SQ3TDBL (0xfebf1018)");
  EXPECT_EQ(d->vcpus[0].exits.back().value, 0u);
  EXPECT_EQ(d->DescribeExit(d->vcpus[1].exits[0]), "exit PIO write 1B to com1.THR (port 0x3f8)");
  ASSERT_TRUE(d->vcpus[2].in_progress.has_value());
  EXPECT_EQ(d->DescribeExit(*d->vcpus[2].in_progress),
            "exit MMIO read 4B from nvme0.CSTS (0xfebf001c)");
  EXPECT_EQ(d->vcpus[0].named_counters.at("kvm.exits"), 555u);
  EXPECT_EQ(d->Attribute("vmm"), "test");
  ASSERT_EQ(d->devices.size(), 2u);
  EXPECT_EQ(d->devices[0].id, 0x0300u);
  EXPECT_EQ(d->maps.size(), 2u);
  ASSERT_EQ(d->findings.size(), 1u);
  EXPECT_EQ(d->findings[0].type, FindingType::kSlowExit);
  EXPECT_EQ(
      d->findings[0].text.rfind("vCPU 1: exit PIO write 1B to com1.THR (port 0x3f8) took ", 0), 0u);
  ASSERT_EQ(d->device_events.size(), 2u);
  EXPECT_EQ(d->device_events[1].note, "EIO");
  EXPECT_EQ(d->counters.io_in_flight, 1u);
  EXPECT_EQ(d->clock.source, rec_->clock().calibration().source);
  EXPECT_EQ(d->clock.tsc_hz, rec_->clock().calibration().tsc_hz);
  EXPECT_EQ(d->process.pid, getpid());
  EXPECT_FALSE(d->host.sysname.empty());
  // Serialising what was read gives the same bytes.
  std::string bytes;
  {
    auto again = ParseDump(SerializeDump(*d));
    ASSERT_TRUE(again.has_value()) << again.error().message;
    EXPECT_EQ(SerializeDump(*again), SerializeDump(*d));
  }
}

TEST_F(DumpTest, GuestDataOnlyWhenAskedFor) {
  const std::string plain = (dir_ / "plain.esdump").string();
  const std::string with = (dir_ / "with.esdump").string();
  ASSERT_TRUE(rec_->WriteDump(plain).has_value());
  ASSERT_TRUE(rec_->WriteDump(with, {.include_guest_data = true}).has_value());
  auto p = ReadDump(plain);
  auto w = ReadDump(with);
  ASSERT_TRUE(p && w);
  EXPECT_FALSE(p->includes_guest_data);
  EXPECT_TRUE(w->includes_guest_data);
  EXPECT_EQ(w->vcpus[0].exits.back().value, 0x1000u + 99);
  EXPECT_NE(w->vcpus[0].exits.back().flags & kExitFlagValue, 0);
  for (const auto& v : p->vcpus) {
    for (const auto& e : v.exits) {
      EXPECT_EQ(e.value, 0u);
      EXPECT_EQ(e.flags & kExitFlagValue, 0);
    }
  }
  // A snapshot with data serialised without the opt-in drops it too.
  auto stripped = ParseDump(SerializeDump(rec_->Snapshot({.include_guest_data = true})));
  ASSERT_TRUE(stripped.has_value());
  EXPECT_FALSE(stripped->includes_guest_data);
  EXPECT_EQ(stripped->vcpus[0].exits.back().value, 0u);
}

TEST_F(DumpTest, FutureVersionIsUnsupported) {
  std::string b = SerializeDump(rec_->Snapshot());
  Put32(b, 8, kDumpVersion + 2);
  FixHeaderCrc(b);
  auto d = ParseDump(b, "future.esdump");
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code, ErrorCode::kUnsupported);
  EXPECT_EQ(d.error().message, "future.esdump: dump version " + std::to_string(kDumpVersion + 2) +
                                   " is newer than this exitscope (max " +
                                   std::to_string(kDumpVersion) + ")");
}

TEST_F(DumpTest, TruncationNamesSectionAndOffset) {
  const std::string b = SerializeDump(rec_->Snapshot());
  // Find the exits section (id 7) in the table and cut inside it.
  uint64_t off = 0, len = 0;
  for (uint32_t i = 0; i < Le32(b, 20); ++i) {
    const size_t e = 64 + 32 * i;
    if (Le32(b, e) == 7) {
      off = Le64(b, e + 8);
      len = Le64(b, e + 16);
    }
  }
  ASSERT_GT(len, 0u);
  const std::string cut = b.substr(0, off + 10);
  auto d = ParseDump(cut, "cut.esdump");
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code, ErrorCode::kCorrupt);
  EXPECT_EQ(d.error().message, "cut.esdump: truncated at offset " + std::to_string(off + 10) +
                                   ": section 'exits' needs " + std::to_string(len) +
                                   " bytes at offset " + std::to_string(off));
}

// One bad record with valid checksums (kind 200) never makes the dump unreadable: the record
// is kept, shown as kind#200, and the reader says what it found.
TEST_F(DumpTest, SemanticCorruptionOfOneRecordIsReadWithAWarning) {
  // The writer stores the kind as it is given (as a writer with a bug, or a newer one, would).
  Dump s = rec_->Snapshot();
  s.vcpus[0].exits[0].kind = static_cast<ExitKind>(200);
  auto d = ParseDump(SerializeDump(s), "x");
  ASSERT_TRUE(d.has_value()) << d.error().message;
  ASSERT_EQ(d->warnings.size(), 1u);
  EXPECT_EQ(d->warnings[0], "1 record has an unknown exit kind (first: 200); shown as kind#200");
  size_t n = 0;
  for (const DumpVcpu& v : d->vcpus) {
    for (const DumpExit& x : v.exits) n += ToString(x.kind) == "kind#200";
  }
  EXPECT_EQ(n, 1u);
}

// Structure that is wrong (a range naming a device the dump does not have) is still refused.
TEST_F(DumpTest, StructuralCorruptionWithValidChecksumIsRejected) {
  std::string b = SerializeDump(rec_->Snapshot());
  for (uint32_t i = 0; i < Le32(b, 20); ++i) {
    const size_t e = 64 + 32 * i;
    if (Le32(b, e) != 5) continue;
    const uint64_t off = Le64(b, e + 8), len = Le64(b, e + 16);
    Put32(b, off + 4 + 4, 77);  // device of the first range
    Put32(b, e + 24, Crc32(std::string_view(b).substr(off, len)));
  }
  Put32(b, 32, Crc32(std::string_view(b).substr(64, 32 * Le32(b, 20))));
  FixHeaderCrc(b);
  auto d = ParseDump(b, "x");
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code, ErrorCode::kCorrupt);
  EXPECT_NE(d.error().message.find("section 'ranges' is corrupt at offset"), std::string::npos)
      << d.error().message;
  EXPECT_NE(d.error().message.find("names device 77"), std::string::npos) << d.error().message;
}

// Fuzz-style: every truncation and byte flips across the whole file give a clean error.
TEST_F(DumpTest, FlippedAndTruncatedBytesNeverCrash) {
  const std::string b =
      SerializeDump(rec_->Snapshot({.include_guest_data = true}), {.include_guest_data = true});
  ASSERT_TRUE(ParseDump(b).has_value());
  for (size_t n = 0; n < b.size(); n += (n < 4096 ? 1 : 7)) {
    auto d = ParseDump(std::string_view(b).substr(0, n), "t");
    ASSERT_FALSE(d.has_value()) << n;
    ASSERT_EQ(d.error().code, ErrorCode::kCorrupt) << d.error().message;
    ASSERT_FALSE(d.error().message.empty());
  }
  std::mt19937 rng(7);
  for (size_t i = 0; i < b.size(); i += 1 + i / 512) {
    std::string m = b;
    m[i] = static_cast<char>(m[i] ^ (1 + rng() % 255));
    auto d = ParseDump(m, "f");
    if (d.has_value()) continue;  // e.g. a flip in reserved header bytes covered by nothing
    ASSERT_TRUE(d.error().code == ErrorCode::kCorrupt || d.error().code == ErrorCode::kUnsupported)
        << d.error().message;
  }
  // Flips with checksums recomputed reach the section decoders.
  const uint32_t nsec = Le32(b, 20);
  for (int round = 0; round < 3000; ++round) {
    std::string m = b;
    const size_t at = 64 + 32 * nsec + rng() % (m.size() - 64 - 32 * nsec);
    m[at] = static_cast<char>(rng());
    for (uint32_t i = 0; i < nsec; ++i) {
      const size_t e = 64 + 32 * i;
      Put32(m, e + 24, Crc32(std::string_view(m).substr(Le64(m, e + 8), Le64(m, e + 16))));
    }
    Put32(m, 32, Crc32(std::string_view(m).substr(64, 32 * nsec)));
    FixHeaderCrc(m);
    auto d = ParseDump(m, "f");
    if (!d.has_value()) {
      ASSERT_EQ(d.error().code, ErrorCode::kCorrupt) << d.error().message;
    }
  }
  for (int round = 0; round < 2000; ++round) {
    std::string junk(rng() % 512, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    if (round % 2 == 0 && junk.size() >= 8) std::memcpy(junk.data(), kDumpMagic, 8);
    EXPECT_FALSE(ParseDump(junk).has_value());
  }
  auto missing = ReadDump((dir_ / "missing.esdump").string());
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  auto notdump = ParseDump(
      "hello world, this is not a dump at all......................................", "n");
  ASSERT_FALSE(notdump.has_value());
  EXPECT_EQ(notdump.error().message, "n: not an exitscope dump (bad magic)");
}

// A guest moving a PCI BAR (the range removed and re-added at another base) and a range removed
// for good: every exit keeps the register it touched, in the snapshot and through a file.
TEST_F(DumpTest, RegisterNamesSurviveAMovedBar) {
  RecorderOptions o;
  o.start_watchdog = false;
  auto rec = std::move(*Recorder::Create(o));
  AddressSpace& as = rec->address_space();
  const uint32_t nvme = *as.AddDevice({.name = "nvme0", .kind = "nvme"});
  const uint32_t com = *as.AddDevice({.name = "com1", .kind = "uart16550"});
  ASSERT_TRUE(as.AddRange(IoSpace::kMmio, 0xfebf0000, 0x4000, nvme, *RegisterMap::Builtin("nvme")));
  ASSERT_TRUE(as.AddRange(IoSpace::kPio, 0x3f8, 8, com, *RegisterMap::Builtin("uart16550")));
  auto exit = [&](ExitKind kind, uint64_t addr, uint8_t size, AccessDir dir) {
    rec->BeginExit(0, kind, addr, size, dir, 1);
    rec->EndExit(0);
  };
  exit(ExitKind::kMmio, 0xfebf1008, 4, AccessDir::kWrite);  // before the move
  exit(ExitKind::kMmio, 0xfebf001c, 4, AccessDir::kRead);
  exit(ExitKind::kPio, 0x3fd, 1, AccessDir::kRead);
  // The guest reprograms the BAR: unregistered, then registered at another base.
  ASSERT_TRUE(as.RemoveRange(IoSpace::kMmio, 0xfebf0000));
  ASSERT_TRUE(as.AddRange(IoSpace::kMmio, 0xfe000000, 0x4000, nvme, *RegisterMap::Builtin("nvme")));
  ASSERT_TRUE(as.RemoveRange(IoSpace::kPio, 0x3f8));        // and the UART goes away
  exit(ExitKind::kMmio, 0xfe001008, 4, AccessDir::kWrite);  // after the move
  exit(ExitKind::kMmio, 0xfe00001c, 4, AccessDir::kRead);
  exit(ExitKind::kMmio, 0xfebf1008, 4, AccessDir::kWrite);  // the old base: nothing there now
  const std::vector<std::string> want = {
      "exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008)",
      "exit MMIO read 4B from nvme0.CSTS (0xfebf001c)",
      "exit PIO read 1B from com1.LSR (port 0x3fd)",
      "exit MMIO write 4B to nvme0.SQ1TDBL (0xfe001008)",
      "exit MMIO read 4B from nvme0.CSTS (0xfe00001c)",
      "exit MMIO write 4B to unassigned (0xfebf1008)",
  };
  auto check = [&](const Dump& d, const char* what) {
    SCOPED_TRACE(what);
    ASSERT_EQ(d.vcpus[0].exits.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(d.DescribeExit(d.vcpus[0].exits[i]), want[i]) << "exit " << i;
    }
    EXPECT_EQ(d.RegisterName(d.vcpus[0].exits[0]), "SQ1TDBL");
    const RegisterMap* uart = d.MapFor(d.vcpus[0].exits[2]);  // its range is gone
    ASSERT_NE(uart, nullptr);
    EXPECT_EQ(uart->name(), "uart16550");
    // The ranges are those at snapshot time: the old base and the UART are gone from them.
    EXPECT_EQ(d.MapFor(IoSpace::kMmio, 0xfebf1008), nullptr);
    EXPECT_EQ(d.MapFor(IoSpace::kPio, 0x3fd), nullptr);
  };
  const Dump snap = rec->Snapshot();
  check(snap, "snapshot");
  const std::string path = (dir_ / "moved-bar.esdump").string();
  ASSERT_TRUE(WriteDumpFile(snap, path));
  auto read = ReadDump(path);
  ASSERT_TRUE(read) << read.error().message;
  EXPECT_EQ(read->version, kDumpVersion);
  EXPECT_TRUE(read->warnings.empty());
  check(*read, "written and read back");
}

// Version 1 (exit records without a map index, named from the ranges at snapshot time) stays
// readable, and names the same registers once rewritten in the current version.
TEST_F(DumpTest, AVersion1DumpReadsAndKeepsItsNames) {
  const std::string path = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/joint-blk.esdump";
  auto v1 = ReadDump(path);
  ASSERT_TRUE(v1) << v1.error().message;
  ASSERT_EQ(v1->version, 1u);
  auto again = ParseDump(SerializeDump(*v1, {.include_guest_data = true}), "rewritten");
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->version, kDumpVersion);
  ASSERT_EQ(again->vcpus.size(), v1->vcpus.size());
  size_t named = 0;
  for (size_t v = 0; v < v1->vcpus.size(); ++v) {
    const auto& a = v1->vcpus[v].exits;
    const auto& b = again->vcpus[v].exits;
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].map, kNoRegister);
      EXPECT_EQ(v1->RegisterName(a[i]), again->RegisterName(b[i])) << "vCPU " << v << " exit " << i;
      EXPECT_EQ(v1->DescribeExit(a[i]), again->DescribeExit(b[i]));
      named += !v1->RegisterName(a[i]).empty();
    }
  }
  EXPECT_GT(named, 0u) << path << ": no exit names a register";
}

// Every older dump in testdata (version 1 from the KVM host, version 2 from this build's
// predecessor) rewritten in the current version (coded exits since version 3) holds the same
// exits, field by field, and the same in-progress exits; the coded exits are a fraction of the
// fixed-size ones.
TEST_F(DumpTest, OlderDumpsRewriteAsVersion3WithTheSameExits) {
  const std::string dir = EXITSCOPE_TESTDATA_DIR;
  bool saw_v2 = false;
  for (const char* name :
       {"kvm-host/joint-blk.esdump", "kvm-host/joint-sched.esdump", "kvm-host/mmio-storm.esdump",
        "kvm-host/blk-backend-delay.esdump", "kvm-host/hello-lsr-delay.esdump",
        "kvm-host/blk-kvm-stats.esdump", "dumps/c-example.esdump", "dumps/v2-mmio-storm.esdump"}) {
    SCOPED_TRACE(name);
    const std::string path = dir + "/" + name;
    auto old = ReadDump(path);
    ASSERT_TRUE(old) << old.error().message;
    ASSERT_LT(old->version, 3u);
    saw_v2 = saw_v2 || old->version == 2;
    const std::string bytes = SerializeDump(*old, {.include_guest_data = true});
    auto v3 = ParseDump(bytes, "rewritten");
    ASSERT_TRUE(v3) << v3.error().message;
    EXPECT_EQ(v3->version, kDumpVersion);
    ASSERT_EQ(v3->vcpus.size(), old->vcpus.size());
    uint64_t n = 0;
    for (size_t v = 0; v < old->vcpus.size(); ++v) {
      const auto& a = old->vcpus[v].exits;
      const auto& b = v3->vcpus[v].exits;
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(std::memcmp(&a[i], &b[i], offsetof(DumpExit, map) + sizeof(uint32_t)), 0)
            << "vCPU " << v << " exit " << i;
      }
      n += a.size();
      ASSERT_EQ(old->vcpus[v].in_progress.has_value(), v3->vcpus[v].in_progress.has_value());
    }
    const uint64_t fixed = 8 + n * (old->version == 1 ? 56 : 60);
    std::printf("%-36s v%u: %6llu exits, file %8zu bytes; as v3 %8zu bytes (exits %llu -> ", name,
                old->version, static_cast<unsigned long long>(n),
                static_cast<size_t>(std::filesystem::file_size(path)), bytes.size(),
                static_cast<unsigned long long>(fixed));
    uint64_t exits_bytes = 0;
    for (uint32_t i = 0; i < Le32(bytes, 20); ++i) {
      if (Le32(bytes, 64 + 32 * i) == 7) exits_bytes = Le64(bytes, 64 + 32 * i + 16);
    }
    std::printf("%llu bytes, %.1f a record)\n", static_cast<unsigned long long>(exits_bytes),
                n == 0 ? 0.0 : static_cast<double>(exits_bytes - 8) / static_cast<double>(n));
  }
  EXPECT_TRUE(saw_v2) << "no version-2 dump among the inputs";
}

TEST_F(DumpTest, DumpOnSignal) {
  ASSERT_FALSE(rec_->InstallDumpSignal(SIGUSR1, "/nonexistent-dir").has_value());
  ASSERT_TRUE(rec_->InstallDumpSignal(SIGUSR1, dir_.string()).has_value());
  ASSERT_EQ(raise(SIGUSR1), 0);
  std::string path;
  for (int i = 0; i < 2000 && path.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    path = rec_->last_signal_dump();
  }
  ASSERT_FALSE(path.empty()) << "no dump written within 10 s of the signal";
  EXPECT_EQ(fs::path(path).parent_path(), dir_);
  auto d = ReadDump(path);
  ASSERT_TRUE(d.has_value()) << d.error().message;
  EXPECT_EQ(d->vcpus.size(), 3u);
  rec_->RemoveDumpSignal();
}

}  // namespace
}  // namespace exitscope
