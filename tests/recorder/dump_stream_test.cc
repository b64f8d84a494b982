// The streamed dump (Recorder::WriteDump: rings -> file records -> file, docs/recorder.md
// "Scale") writes the same bytes as the in-memory path (SerializeDump of Snapshot): with the
// vCPUs quiet, byte for byte, including an exit in progress, device events, findings,
// attributes, named counters, wrapped rings, guest data on and off, and a register map only an
// old address-space generation has (the fallback). WriteDumpFile, which now writes as it
// encodes, gives SerializeDump's bytes too, and the CRC combination it relies on is checked
// against the plain CRC. A write failing in the middle leaves the previous dump intact.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "base/crc32.h"
#include "exitscope/dump.h"
#include "exitscope/flight_recorder.h"
#include "exitscope/recorder.h"

namespace exitscope {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class DumpStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("exitscope-dump-stream-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    RecorderOptions o;
    o.num_vcpus = 4;
    o.events_per_vcpu = 64;
    o.start_watchdog = false;
    o.slow_exit.threshold_ns = 1'000'000;
    rec_ = std::move(*Recorder::Create(o));
    rec_->SetLogSink([](std::string_view) {});
    AddressSpace& as = rec_->address_space();
    nvme_ = *as.AddDevice({.name = "nvme0", .kind = "nvme", .id = 0x0300});
    const uint32_t com = *as.AddDevice({.name = "com1", .kind = "uart16550"});
    ASSERT_TRUE(
        as.AddRange(IoSpace::kMmio, 0xfebf0000, 0x4000, nvme_, *RegisterMap::Builtin("nvme"))
            .has_value());
    ASSERT_TRUE(
        as.AddRange(IoSpace::kPio, 0x3f8, 8, com, *RegisterMap::Builtin("uart16550")).has_value());
    for (int i = 0; i < 150; ++i) {  // wraps vCPU 0's ring twice
      rec_->BeginExit(0, ExitKind::kMmio, 0xfebf1000 + 8 * (i % 4), 4, AccessDir::kWrite,
                      0x1000 + i);
      rec_->EndExit(0);
    }
    for (int i = 0; i < 10; ++i) {
      rec_->BeginExit(1, ExitKind::kPio, 0x3f8 + i % 8, 1, AccessDir::kRead);
      rec_->EndExit(1, 'a' + i);
    }
    rec_->BeginExit(1, ExitKind::kPio, 0x3f8, 1, AccessDir::kWrite, 'h');
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    rec_->EndExit(1);                                                      // a slow exit -> finding
    rec_->BeginExit(2, ExitKind::kMmio, 0xfebf001c, 4, AccessDir::kRead);  // in progress
    rec_->BeginExit(3, ExitKind::kHlt);
    rec_->EndExit(3);
    rec_->IoSubmit(nvme_, 9);
    rec_->BackendError(nvme_, -5, "EIO");
    rec_->SetAttribute("vmm", "test");
    (void)rec_->SetVcpuCounter(0, "kvm.exits", 555);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // WriteDump's file against SerializeDump of a Snapshot taken right after (the vCPUs are
  // quiet): only the snapshot instant differs, so it is copied from the file's dump before
  // serialising (times, and the in-progress exit's duration so far).
  void ExpectSameBytesAsSnapshot(const DumpOptions& opts) {
    const std::string path = (dir_ / "s.esdump").string();
    ASSERT_TRUE(rec_->WriteDump(path, opts).has_value());
    const std::string bytes = Slurp(path);
    Dump s = rec_->Snapshot(opts);
    auto back = ParseDump(bytes, path);
    ASSERT_TRUE(back.has_value()) << back.error().message;
    EXPECT_TRUE(back->warnings.empty());
    s.monotonic_ns = back->monotonic_ns;
    s.realtime_ns = back->realtime_ns;
    ASSERT_EQ(s.vcpus.size(), back->vcpus.size());
    for (size_t i = 0; i < s.vcpus.size(); ++i) {
      ASSERT_EQ(s.vcpus[i].in_progress.has_value(), back->vcpus[i].in_progress.has_value());
      if (s.vcpus[i].in_progress) {
        s.vcpus[i].in_progress->duration_ns = back->vcpus[i].in_progress->duration_ns;
      }
    }
    const std::string want = SerializeDump(s, opts);
    ASSERT_EQ(bytes.size(), want.size());
    EXPECT_TRUE(bytes == want) << "the streamed file differs from SerializeDump(Snapshot())";
  }

  fs::path dir_;
  std::unique_ptr<Recorder> rec_;
  uint32_t nvme_ = 0;
};

TEST_F(DumpStreamTest, WriteDumpGivesSerializeDumpsBytes) {
  ExpectSameBytesAsSnapshot({});
  ExpectSameBytesAsSnapshot({.include_guest_data = true});
  ExpectSameBytesAsSnapshot({.max_exits_per_vcpu = 5});
  // Coded on several threads (3 of 4 vCPUs; more threads than vCPUs): the same bytes.
  ExpectSameBytesAsSnapshot({.include_guest_data = true, .threads = 3});
  ExpectSameBytesAsSnapshot({.threads = 16});
  ExpectSameBytesAsSnapshot({.max_exits_per_vcpu = 5, .threads = 2});
  const Dump d = *ReadDump((dir_ / "s.esdump").string());
  EXPECT_EQ(d.vcpus[0].exits.size(), 5u);
  EXPECT_TRUE(d.vcpus[2].in_progress.has_value());
  EXPECT_FALSE(d.vcpus[0].in_progress.has_value());
  EXPECT_EQ(d.vcpus[0].counters.written, 150u);
  EXPECT_EQ(d.vcpus[0].counters.overwritten, 150u - 64u);
  EXPECT_EQ(d.vcpus[0].named_counters.at("kvm.exits"), 555u);
  EXPECT_EQ(d.device_events.size(), 2u);
  EXPECT_FALSE(d.findings.empty());
  EXPECT_EQ(d.Attribute("vmm"), "test");
}

TEST_F(DumpStreamTest, WriteDumpFileGivesSerializeDumpsBytes) {
  for (bool guest : {false, true}) {
    const Dump d = rec_->Snapshot({.include_guest_data = guest});
    const std::string path = (dir_ / "f.esdump").string();
    ASSERT_TRUE(WriteDumpFile(d, path, {.include_guest_data = guest}).has_value());
    EXPECT_TRUE(Slurp(path) == SerializeDump(d, {.include_guest_data = guest}));
  }
  // An empty dump (no vCPUs, no exits section records) too.
  const Dump empty;
  const std::string path = (dir_ / "e.esdump").string();
  ASSERT_TRUE(WriteDumpFile(empty, path).has_value());
  EXPECT_TRUE(Slurp(path) == SerializeDump(empty));
  EXPECT_TRUE(ReadDump(path).has_value());
}

// Exits resolved in a generation whose range was removed since: their map is not among the
// current ranges', so the streamed layout cannot know it up front, and WriteDump takes the
// in-memory path (also when the map turns up on one of several coding threads). The file still
// names their registers.
TEST_F(DumpStreamTest, AMapOnlyAnOldGenerationHasStillNamesTheRegister) {
  AddressSpace& as = rec_->address_space();
  const uint32_t blk = *as.AddDevice({.name = "nvme1", .kind = "nvme"});
  auto map =
      std::make_shared<const RegisterMap>(**RegisterMap::Builtin("nvme"));  // not shared with nvme0
  ASSERT_TRUE(as.AddRange(IoSpace::kMmio, 0xfe000000, 0x4000, blk, map).has_value());
  rec_->BeginExit(3, ExitKind::kMmio, 0xfe001000, 4, AccessDir::kWrite, 1);
  rec_->EndExit(3);
  ASSERT_TRUE(as.RemoveRange(IoSpace::kMmio, 0xfe000000).has_value());
  ExpectSameBytesAsSnapshot({.threads = 4});  // the other threads stop coding, and it falls back
  ExpectSameBytesAsSnapshot({});
  const Dump d = *ReadDump((dir_ / "s.esdump").string());
  const DumpExit& e = d.vcpus[3].exits.back();
  EXPECT_EQ(d.DeviceName(e.device), "nvme1");
  EXPECT_EQ(d.RegisterName(e), "SQ0TDBL");
}

// A dump is refused where it would replace something that is not a regular file, as before,
// and a failed streamed dump leaves neither the file nor its temporary.
TEST_F(DumpStreamTest, FailuresLeaveNothingBehind) {
  const Status s = rec_->WriteDump((dir_ / "missing" / "x.esdump").string());
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find("cannot create"), std::string::npos) << s.error().message;
  const Status full = rec_->WriteDump("/dev/full");
  ASSERT_FALSE(full.has_value());
  EXPECT_NE(full.error().message.find("character device"), std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir_));
}

// A write that fails in the middle of the exits (the file-size limit, as a full disk would)
// fails the dump with the path and the reason, keeps the previous dump byte for byte and
// leaves no temporary file, on 1 coding thread and on 4 (each writes its own vCPUs). In a
// child, whose limit cannot leak.
TEST_F(DumpStreamTest, AWriteFailingMidExitsKeepsThePreviousDump) {
  const std::string path = (dir_ / "v.esdump").string();
  ASSERT_TRUE(rec_->WriteDump(path).has_value());
  const std::string before = Slurp(path);
  RecorderOptions o;
  o.num_vcpus = 8;
  o.events_per_vcpu = 1 << 14;
  o.start_watchdog = false;
  auto big = std::move(*Recorder::Create(o));
  for (uint32_t v = 0; v < 8; ++v) {
    for (int i = 0; i < (1 << 14); ++i) {
      big->BeginExit(v, ExitKind::kHlt);
      big->EndExit(v);
    }
  }
  for (const uint32_t threads : {1u, 4u}) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      signal(SIGXFSZ, SIG_IGN);
      // The big dump's exits are ~48 KiB a vCPU (3 bytes an exit: HLT after HLT); the
      // sections before them ~1 KiB: the limit falls inside the first vCPU's exits.
      const rlimit lim{32 << 10, 32 << 10};
      if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(3);
      const Status s = big->WriteDump(path, {.threads = threads});
      if (s) _exit(4);
      _exit(s.error().message.find(path + ": write failed: File too large") == 0 ? 0 : 5);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << threads << " thread(s): 4: the dump succeeded, 5: another message";
    EXPECT_TRUE(Slurp(path) == before);
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator{}), 1);
  }
}

TEST(DumpStreamCrc, CombineIsTheCrcOfTheConcatenation) {
  std::mt19937_64 rng(7);
  std::string a(300, '\0'), b(70000, '\0');
  for (char& c : a) c = static_cast<char>(rng());
  for (char& c : b) c = static_cast<char>(rng());
  for (size_t la : {size_t{0}, size_t{1}, size_t{8}, size_t{300}}) {
    for (size_t lb : {size_t{0}, size_t{1}, size_t{59}, size_t{4096}, size_t{70000}}) {
      const std::string ab = a.substr(0, la) + b.substr(0, lb);
      EXPECT_EQ(
          base::Crc32Combine(base::Crc32Of(a.substr(0, la)), base::Crc32Of(b.substr(0, lb)), lb),
          base::Crc32Of(ab))
          << la << " + " << lb;
    }
  }
}

// FindStart: the record of an exit seen in progress, if it reached the ring since.
TEST(DumpStreamRing, FindStartFindsTheRecordByItsStart) {
  ExitRing ring(8);
  for (uint64_t i = 1; i <= 20; ++i) {
    ExitRecord r{};
    r.start_ticks = 100 * i;
    ring.Write(r);
  }
  // Held: records 12..19 (starts 1300..2000).
  EXPECT_EQ(ring.FindStart(12, 20, 1500), 14u);
  EXPECT_EQ(ring.FindStart(15, 20, 1500), 20u);  // before `from`: not looked at
  EXPECT_EQ(ring.FindStart(0, 20, 1250), 20u);   // never recorded
  EXPECT_EQ(ring.FindStart(0, 20, 500), 20u);    // overwritten: not held
  EXPECT_EQ(ring.FindStart(0, 16, 1700), 16u);   // at or after `to`
  EXPECT_EQ(ring.FindStart(0, 16, 1600), 15u);
}

}  // namespace
}  // namespace exitscope
