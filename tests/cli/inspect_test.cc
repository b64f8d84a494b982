// `exitscope inspect` end to end: a dump made with the library, read by the binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "exitscope/recorder.h"

namespace {

struct Output {
  int status;
  std::string out;
};

Output RunExitscope(const std::string& args) {
  const std::string cmd = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

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
  const Output o = RunExitscope("inspect " + *path_);
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
  EXPECT_EQ(o.status, 1) << o.out;

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

// The dump `make demo` shows without /dev/kvm must stay readable by this exitscope.
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
