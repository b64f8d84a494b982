// `exitscope inspect` end to end: a dump made with the library, read by the binary.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "exitscope/recorder.h"
#include "support/run.h"

namespace {

using Output = exitscope::test::Ran;
using exitscope::test::RunExitscope;

class InspectTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ =
        new std::string(testing::TempDir() + "/inspect_" + std::to_string(getpid()) + ".esdump");
    exitscope::RecorderOptions o;
    o.num_vcpus = 2;
    o.events_per_vcpu = 256;
    o.slow_exit.threshold_ns = 5'000'000;
    o.watchdog.stuck_exit_ns = 5'000'000;
    auto rec = exitscope::Recorder::Create(o);
    ASSERT_TRUE(rec) << rec.error().message;
    exitscope::Recorder& r = **rec;
    r.SetLogSink([](std::string_view) {});
    const uint32_t uart = *r.address_space().AddDevice({.name = "uart0", .kind = "uart16550"});
    const uint32_t nvme = *r.address_space().AddDevice({.name = "nvme0", .kind = "nvme"});
    ASSERT_TRUE(r.address_space().AddRange(exitscope::IoSpace::kPio, 0x3f8, 8, uart,
                                           *exitscope::RegisterMap::Builtin("uart16550")));
    ASSERT_TRUE(r.address_space().AddRange(exitscope::IoSpace::kMmio, 0xfebf0000, 0x4000, nvme,
                                           *exitscope::RegisterMap::Builtin("nvme")));
    r.SetAttribute("guest", "inspect_test");
    ASSERT_TRUE(r.SetVcpuCounter(0, "kvm.exits", 1234));
    for (int i = 0; i < 50; ++i) {
      r.BeginExit(0, exitscope::ExitKind::kPio, 0x3f8, 1, exitscope::AccessDir::kWrite, 'x');
      r.EndExit(0);
    }
    r.IoSubmit(nvme, 77);
    // vCPU 1 sits in a doorbell write long enough for the watchdog to see it stuck.
    r.BeginExit(1, exitscope::ExitKind::kMmio, 0xfebf1008, 4, exitscope::AccessDir::kWrite, 1);
    for (int i = 0; i < 200 && r.Findings().empty(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    r.EndExit(1);
    r.IoComplete(nvme, 77, 0);
    r.BeginExit(0, exitscope::ExitKind::kMmio, 0xdead0000, 4, exitscope::AccessDir::kRead);
    r.EndExit(0, 0xffffffff);
    ASSERT_TRUE(r.WriteDump(*path_));
  }
  static void TearDownTestSuite() {
    std::remove(path_->c_str());
    delete path_;
  }
  static std::string* path_;
};
std::string* InspectTest::path_ = nullptr;

TEST_F(InspectTest, TableNamesDevicesRegistersSlowExitsAndFindings) {
  const Output o = RunExitscope("inspect --events " + *path_);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("52 exits"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("uart0.THR write"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("nvme0.SQ1TDBL write"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("unassigned 0xdead0000 read"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("vCPU 1: exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008) took"),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("in flight: nvme0 io 77"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("kvm.exits"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("guest data not included"), std::string::npos) << o.out;
}

TEST_F(InspectTest, JsonIsParseableAndFiltered) {
  const Output o = RunExitscope("inspect --format json --vcpu 0 " + *path_);
  ASSERT_EQ(o.status, 0) << o.out;
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["schema"], "exitscope.exit-health.v1");
  EXPECT_EQ(j["exits"], 51);
  EXPECT_EQ(j["by_vcpu"].size(), 1u);
  EXPECT_EQ(j["vcpu_counters"]["kvm.exits"], 1234);
  const Output d = RunExitscope("inspect --format json --device nvme0 " + *path_);
  ASSERT_EQ(d.status, 0) << d.out;
  const auto jd = nlohmann::json::parse(d.out);
  EXPECT_EQ(jd["exits"], 1);
  ASSERT_EQ(jd["slow_exits"].size(), 1u);
  EXPECT_EQ(jd["slow_exits"][0]["target"], "nvme0.SQ1TDBL");
  EXPECT_TRUE(jd["slow_exits"][0]["stalled"]);
}

TEST_F(InspectTest, BadInputGetsOneLineAndStatus2) {
  Output o = RunExitscope("inspect --vcpu 9 " + *path_);
  EXPECT_EQ(o.status, 2);
  EXPECT_NE(o.out.find("--vcpu 9: the dump has 2 vCPUs"), std::string::npos) << o.out;
  o = RunExitscope("inspect --device nvme9 " + *path_);
  EXPECT_EQ(o.status, 2);
  EXPECT_NE(o.out.find("devices: uart0, nvme0"), std::string::npos) << o.out;
  o = RunExitscope("inspect --format xml " + *path_);
  EXPECT_EQ(o.status, 2) << o.out;
  o = RunExitscope("inspect /nonexistent.esdump");
  EXPECT_EQ(o.status, 2) << o.out;  // a file that is not there is bad input

  std::ifstream in(*path_, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = *path_ + ".cut";
  std::ofstream(cut, std::ios::binary).write(bytes.data(), bytes.size() - 100);
  o = RunExitscope("inspect " + cut);
  EXPECT_EQ(o.status, 2) << o.out;
  EXPECT_NE(o.out.find(cut), std::string::npos) << o.out;
  EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 1) << o.out;
  std::remove(cut.c_str());
}

// The C example's shipped dump (the README's tour) must stay readable by this exitscope.
TEST(InspectShipped, DemoFallbackDumpReads) {
  const std::string path = std::string(EXITSCOPE_TESTDATA_DIR) + "/dumps/c-example.esdump";
  const Output o = RunExitscope("inspect " + path);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("c_example (no guest: simulated exit handlers)"), std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("nvme0.SQ1TDBL write"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("Watchdog findings: 3"), std::string::npos) << o.out;
}

}  // namespace

namespace {

// Two different accesses whose old XOR cache keys were equal (0x1_0000_1000 on device 0 and
// 0x1000 on device 1) must be two register rows, not one.
TEST(InspectRegisters, AccessesThatHashedAlikeAreDistinctRows) {
  const std::string path =
      testing::TempDir() + "/inspect_collide_" + std::to_string(getpid()) + ".esdump";
  {
    exitscope::RecorderOptions o;
    o.num_vcpus = 1;
    o.start_watchdog = false;
    auto rec = exitscope::Recorder::Create(o);
    ASSERT_TRUE(rec) << rec.error().message;
    exitscope::Recorder& r = **rec;
    r.SetLogSink([](std::string_view) {});
    const uint32_t d0 = *r.address_space().AddDevice({.name = "high0", .kind = "x"});
    const uint32_t d1 = *r.address_space().AddDevice({.name = "low1", .kind = "x"});
    ASSERT_TRUE(r.address_space().AddRange(exitscope::IoSpace::kMmio, 0x100000000, 0x10000, d0));
    ASSERT_TRUE(r.address_space().AddRange(exitscope::IoSpace::kMmio, 0x0, 0x10000, d1));
    r.BeginExit(0, exitscope::ExitKind::kMmio, 0x100001000, 4, exitscope::AccessDir::kRead);
    r.EndExit(0, 1);
    r.BeginExit(0, exitscope::ExitKind::kMmio, 0x1000, 4, exitscope::AccessDir::kRead);
    r.EndExit(0, 2);
    ASSERT_TRUE(r.WriteDump(path));
  }
  const Output o = RunExitscope("inspect --format json " + path);
  std::remove(path.c_str());
  ASSERT_EQ(o.status, 0) << o.out;
  const nlohmann::json j = nlohmann::json::parse(o.out);
  std::map<std::string, uint64_t> rows;
  for (const auto& g : j["by_register"]) rows[g["key"]] = g["count"];
  EXPECT_EQ(rows.size(), 2u) << o.out;
  EXPECT_EQ(rows["high0+0x1000 read"], 1u) << o.out;
  EXPECT_EQ(rows["low1+0x1000 read"], 1u) << o.out;
}

}  // namespace

namespace {

// Runs build/exitscope with `args` under an address-space cap (RLIMIT_AS): an input that makes
// it allocate without bound fails the test (bad_alloc, a signal) instead of swapping.
Output RunCapped(const std::vector<std::string>& args, rlim_t cap_bytes) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, "pipe failed", {}};
  const pid_t pid = fork();
  if (pid == 0) {
#if !defined(__SANITIZE_ADDRESS__)  // ASan's shadow memory cannot live under a cap (make asan)
    rlimit rl{cap_bytes, cap_bytes};
    setrlimit(RLIMIT_AS, &rl);
#else
    (void)cap_bytes;
#endif
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    const std::string bin = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope";
    std::vector<char*> argv{const_cast<char*>(bin.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFSIGNALED(st)) out += "\n[killed by signal " + std::to_string(WTERMSIG(st)) + "]";
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out, {}};
}

constexpr rlim_t kCap = 1ull << 30;  // 1 GiB of address space: far above any dump here

std::vector<std::string> Esdumps(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".esdump") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Every dump in testdata/crashes and testdata/kvm-host, as a table and as JSON: status 0 with a
// report (JSON that parses), or status 2 with one line naming the file. Never a crash, never
// unbounded memory.
void CheckEveryDumpIn(const std::string& dir, const std::vector<std::string>& required) {
  const std::vector<std::string> files = Esdumps(dir);
  for (const std::string& r : required) {
    ASSERT_TRUE(std::filesystem::is_regular_file(dir + "/" + r))
        << dir << "/" << r << " is missing";
  }
  for (const std::string& f : files) {
    const Output t = RunCapped({"inspect", f}, kCap);
    if (t.status == 0) {
      EXPECT_NE(t.out.find("exitscope exit-health report"), std::string::npos) << f << t.out;
    } else {
      EXPECT_EQ(t.status, 2) << f << ": " << t.out;
      EXPECT_EQ(std::count(t.out.begin(), t.out.end(), '\n'), 1) << f << ": " << t.out;
      EXPECT_NE(t.out.find(f), std::string::npos) << t.out;
    }
    const Output j = RunCapped({"inspect", "--format", "json", "--all", f}, kCap);
    EXPECT_EQ(j.status, t.status) << f << ": " << j.out;
    if (j.status == 0) {
      nlohmann::json doc;
      ASSERT_NO_THROW(doc = nlohmann::json::parse(j.out)) << f << ": " << j.out.substr(0, 300);
      EXPECT_EQ(doc["schema"], "exitscope.exit-health.v1");
      EXPECT_TRUE(doc["warnings"].is_array()) << f;
    }
  }
}

TEST(InspectRegression, EveryCrashReproducerIsReadOrRefusedInOneLine) {
  CheckEveryDumpIn(std::string(EXITSCOPE_TESTDATA_DIR) + "/crashes",
                   {"capi-kind99.esdump", "capi-kind99-in-progress.esdump",
                    "nonutf8-strings.esdump", "nonutf8-attribute-note.esdump"});
}

TEST(InspectRegression, EveryRealKvmHostDumpReads) {
  const std::string dir = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host";
  CheckEveryDumpIn(dir,
                   {"blk-backend-delay.esdump", "hello-lsr-delay.esdump", "mmio-storm.esdump"});
  for (const char* f :
       {"blk-backend-delay.esdump", "hello-lsr-delay.esdump", "mmio-storm.esdump"}) {
    const Output o = RunCapped({"inspect", dir + "/" + f}, kCap);
    EXPECT_EQ(o.status, 0) << f << ": " << o.out;
    EXPECT_EQ(o.out.find("warning"), std::string::npos) << f << ": a genuine dump warns:\n"
                                                        << o.out;
  }
}

// A dump written by the old C API after es_begin_exit(..., 99, ...): every record is shown, the
// unknown kind as itself, with one warning line.
TEST(InspectRegression, UnknownExitKindIsShownAndCounted) {
  const std::string f = std::string(EXITSCOPE_TESTDATA_DIR) + "/crashes/capi-kind99.esdump";
  const Output o = RunCapped({"inspect", f}, kCap);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("kind#99"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("warning   1 record has an unknown exit kind (first: 99)"),
            std::string::npos)
      << o.out;
  const Output p = RunCapped(
      {"inspect", std::string(EXITSCOPE_TESTDATA_DIR) + "/crashes/capi-kind99-in-progress.esdump"},
      kCap);
  ASSERT_EQ(p.status, 0) << p.out;
  EXPECT_NE(p.out.find("kind#99"), std::string::npos) << p.out;
}

// Latin-1 bytes in argv, comm, attributes and notes: JSON replaces them, the reader says so.
TEST(InspectRegression, NonUtf8StringsGiveValidJsonAndAWarning) {
  for (const char* f : {"nonutf8-strings.esdump", "nonutf8-attribute-note.esdump"}) {
    const std::string path = std::string(EXITSCOPE_TESTDATA_DIR) + "/crashes/" + f;
    const Output o = RunCapped({"inspect", "--format", "json", path}, kCap);
    ASSERT_EQ(o.status, 0) << f << ": " << o.out;
    const nlohmann::json j = nlohmann::json::parse(o.out);
    std::string w;
    for (const auto& x : j["warnings"]) w += x.get<std::string>() + "\n";
    EXPECT_NE(w.find("not valid UTF-8"), std::string::npos) << f << ": " << w;
  }
}

// A valid dump under a file name that is not UTF-8 (Latin-1 "\xe9"): JSON still valid.
TEST(InspectRegression, ANonUtf8FileNameGivesValidJson) {
  const std::string src = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/hello-lsr-delay.esdump";
  const std::string dst = testing::TempDir() + "/caf\xe9_" + std::to_string(getpid()) + ".esdump";
  std::filesystem::copy_file(src, dst, std::filesystem::copy_options::overwrite_existing);
  const Output o = RunCapped({"inspect", "--format", "json", dst}, kCap);
  std::filesystem::remove(dst);
  ASSERT_EQ(o.status, 0) << o.out;
  const nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_NE(j["source"].get<std::string>().find("caf\xef\xbf\xbd_"), std::string::npos);
}

// Not a dump at all: refused from fstat, before any read, in bounded memory.
TEST(InspectRegression, DevicesFifosAndDirectoriesAreRefusedBeforeReading) {
  const std::string fifo = testing::TempDir() + "/inspect_fifo_" + std::to_string(getpid());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& f : {std::string("/dev/zero"), fifo, testing::TempDir()}) {
    const Output o = RunCapped({"inspect", f}, kCap);
    EXPECT_EQ(o.status, 2) << f << ": " << o.out;
    EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 1) << f << ": " << o.out;
    EXPECT_NE(o.out.find("not a regular file"), std::string::npos) << o.out;
  }
  unlink(fifo.c_str());
}

}  // namespace
