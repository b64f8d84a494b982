// Dumps on a bad day: where a dump may be written (never over a device node, FIFO, directory
// or through a symlink), what ReadDump refuses before reading (non-regular files), and dumps
// that are inconsistent (overlapping sections, impossible vCPU index, NaN clock, counters that
// cannot be true, unknown exit kinds): refused with one line, or read with a warning.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>

#include "exitscope/recorder.h"

namespace exitscope {
namespace {

std::string Temp(const std::string& name) {
  return testing::TempDir() + "/dumpsafety_" + std::to_string(getpid()) + "_" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Dump SmallDump() {
  RecorderOptions o;
  o.num_vcpus = 2;
  o.events_per_vcpu = 16;
  o.start_watchdog = false;
  auto rec = Recorder::Create(o);
  EXPECT_TRUE(rec);
  Recorder& r = **rec;
  const uint32_t dev = *r.address_space().AddDevice({.name = "uart0", .kind = "uart16550"});
  EXPECT_TRUE(
      r.address_space().AddRange(IoSpace::kPio, 0x3f8, 8, dev, *RegisterMap::Builtin("uart16550")));
  for (int i = 0; i < 3; ++i) {
    r.BeginExit(0, ExitKind::kPio, 0x3f8, 1, AccessDir::kWrite, 'a');
    r.EndExit(0);
  }
  return r.Snapshot();
}

TEST(DumpWrite, NeverReplacesAnythingButARegularFile) {
  const Dump d = SmallDump();
  // A symlink: neither the link nor its target changes.
  const std::string victim = Temp("victim");
  std::ofstream(victim) << "precious";
  const std::string link = Temp("link.esdump");
  ASSERT_EQ(symlink(victim.c_str(), link.c_str()), 0);
  Status s = WriteDumpFile(d, link);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("symlink"), std::string::npos) << s.error().message;
  struct stat st;
  ASSERT_EQ(lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(ReadAll(victim), "precious");
  // A FIFO stays a FIFO (as /dev/null or /dev/full would stay devices).
  const std::string fifo = Temp("fifo.esdump");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  s = WriteDumpFile(d, fifo);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("a FIFO"), std::string::npos) << s.error().message;
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // A directory.
  EXPECT_FALSE(WriteDumpFile(d, testing::TempDir()));
  // A symlink planted at the temporary name is neither followed nor removed: the dump goes to
  // another new name beside it and is renamed into place.
  const std::string target = Temp("target.esdump");
  const std::string tmp = target + ".tmp." + std::to_string(getpid());
  ASSERT_EQ(symlink(victim.c_str(), tmp.c_str()), 0);
  EXPECT_TRUE(WriteDumpFile(d, target));
  EXPECT_EQ(ReadAll(victim), "precious");
  ASSERT_EQ(lstat(tmp.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_TRUE(ReadDump(target));
  unlink(tmp.c_str());
  unlink(target.c_str());
  // A regular file is replaced.
  std::ofstream(target) << "old";
  ASSERT_TRUE(WriteDumpFile(d, target));
  EXPECT_TRUE(ReadDump(target));
  for (const std::string& p : {victim, link, fifo, target}) unlink(p.c_str());
}

TEST(DumpRead, RefusesNonRegularFilesBeforeReading) {
  auto d = ReadDump("/dev/zero");
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, ErrorCode::kCorrupt);
  EXPECT_NE(d.error().message.find("not a regular file"), std::string::npos) << d.error().message;
  const std::string fifo = Temp("read.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  d = ReadDump(fifo);  // must not block waiting for a writer
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("FIFO"), std::string::npos) << d.error().message;
  unlink(fifo.c_str());
  d = ReadDump(testing::TempDir());
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("directory"), std::string::npos) << d.error().message;
}

// ---- Inconsistent dumps, made by patching a real serialisation and fixing its checksums ----

uint32_t Crc32(std::string_view data) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : data) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xffffffffu;
}
uint64_t Get(const std::string& b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(b[at + i])} << (8 * i);
  return v;
}
void Put(std::string& b, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
constexpr size_t kTable = 64;
size_t Entry(const std::string& b, uint32_t id) {
  for (size_t e = kTable;; e += 32) {
    if (Get(b, e, 4) == id) return e;
  }
}
size_t SectionOffset(const std::string& b, uint32_t id) {
  return Get(b, Entry(b, id) + 8, 8);
}
// Recomputes every section CRC, the table CRC and the header CRC.
void Reseal(std::string& b) {
  const uint32_t nsec = static_cast<uint32_t>(Get(b, 20, 4));
  for (uint32_t i = 0; i < nsec; ++i) {
    const size_t e = kTable + 32 * i;
    Put(b, e + 24, Crc32(std::string_view(b).substr(Get(b, e + 8, 8), Get(b, e + 16, 8))), 4);
  }
  Put(b, 32, Crc32(std::string_view(b).substr(kTable, 32 * nsec)), 4);
  Put(b, 36, 0, 4);
  Put(b, 36, Crc32(std::string_view(b).substr(0, 64)), 4);
}
enum : uint32_t { kStrings = 1, kMeta = 2, kVcpus = 6, kExits = 7 };

TEST(DumpRead, TheTestSealIsRight) {
  std::string b = SerializeDump(SmallDump());
  const std::string orig = b;
  Reseal(b);
  EXPECT_EQ(b, orig);
  EXPECT_TRUE(ParseDump(b, "x"));
}

TEST(DumpRead, OverlappingSectionsAreRefused) {
  std::string b = SerializeDump(SmallDump());
  // meta points at the bytes of strings.
  const size_t meta = Entry(b, kMeta), strings = Entry(b, kStrings);
  Put(b, meta + 8, Get(b, strings + 8, 8), 8);
  Put(b, meta + 16, Get(b, strings + 16, 8), 8);
  Reseal(b);
  auto d = ParseDump(b, "x.esdump");
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("overlaps"), std::string::npos) << d.error().message;
}

TEST(DumpRead, AnImpossibleVcpuIndexIsRefused) {
  std::string b = SerializeDump(SmallDump());
  Put(b, SectionOffset(b, kVcpus) + 4, 0xffffffffu, 4);
  Reseal(b);
  auto d = ParseDump(b, "x.esdump");
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("has index 4294967295"), std::string::npos) << d.error().message;
}

TEST(DumpRead, NanClockAndImpossibleCountersAreReadWithAWarning) {
  std::string b = SerializeDump(SmallDump());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  uint64_t u;
  std::memcpy(&u, &nan, 8);
  Put(b, SectionOffset(b, kMeta) + 20, u, 8);
  // vCPU 0: index 4, capacity 8, written 8, overwritten 8: overwritten = 2^64-1.
  Put(b, SectionOffset(b, kVcpus) + 4 + 4 + 8 + 8, ~0ull, 8);
  Reseal(b);
  auto d = ParseDump(b, "x.esdump");
  ASSERT_TRUE(d) << d.error().message;
  std::string all;
  for (const std::string& w : d->warnings) all += w + "\n";
  EXPECT_NE(all.find("ns_per_tick is nan"), std::string::npos) << all;
  EXPECT_NE(all.find("ring counters cannot be true"), std::string::npos) << all;
  EXPECT_EQ(d->clock.ns_per_tick, 0.0);
}

TEST(DumpRead, AnUnknownExitKindIsShownAndCountedNotFatal) {
  // The writer stores kind and direction as they are: a dump written by a buggy or newer
  // writer is made by giving the values to SerializeDump.
  Dump small = SmallDump();
  small.vcpus[0].exits[0].kind = static_cast<ExitKind>(99);
  small.vcpus[0].exits[1].dir = static_cast<AccessDir>(7);
  auto d = ParseDump(SerializeDump(small), "x.esdump");
  ASSERT_TRUE(d) << d.error().message;
  ASSERT_EQ(d->vcpus[0].exits.size(), 3u);  // every record is read
  EXPECT_EQ(ToString(d->vcpus[0].exits[0].kind), "kind#99");
  EXPECT_EQ(d->vcpus[0].exits[1].dir, AccessDir::kNone);
  ASSERT_EQ(d->warnings.size(), 2u);
  EXPECT_EQ(d->warnings[0], "1 record has an unknown exit kind (first: 99); shown as kind#99");
  EXPECT_NE(d->warnings[1].find("unknown access direction (first: 7)"), std::string::npos);
  // What it read serialises and reads again.
  EXPECT_TRUE(ParseDump(SerializeDump(*d), "again"));
}

TEST(DumpRead, AnExitWithAMapTheDumpDoesNotHaveLosesOnlyItsRegister) {
  Dump small = SmallDump();
  small.vcpus[0].exits[0].map = 9;  // map index of the first exit: 9 of 1
  auto d = ParseDump(SerializeDump(small), "x.esdump");
  ASSERT_TRUE(d) << d.error().message;
  const auto& ex = d->vcpus[0].exits;
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(d->DescribeExit(ex[0]), "exit PIO write 1B to uart0 (port 0x3f8)");
  EXPECT_EQ(d->DescribeExit(ex[1]), "exit PIO write 1B to uart0.THR (port 0x3f8)");
  ASSERT_EQ(d->warnings.size(), 1u);
  EXPECT_EQ(d->warnings[0],
            "1 exit names a register map the dump does not have; shown without a register");
}

TEST(DumpSignal, SynchronousFaultSignalsAreRefused) {
  RecorderOptions o;
  o.start_watchdog = false;
  auto rec = Recorder::Create(o);
  ASSERT_TRUE(rec);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGKILL, SIGSTOP}) {
    const Status s = (*rec)->InstallDumpSignal(sig, testing::TempDir());
    ASSERT_FALSE(s) << "signal " << sig;
    EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace exitscope
