// `exitscope kvm report` end to end: the binary on the real capture, exit codes and one-line
// errors for bad input and bad usage, and the same report byte for byte whichever way the
// .dat is read (fast path or checked path, one thread or one decompressing thread per
// compressed CPU stream). Skips (with the reason) when the binary is not built.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/run.h"

namespace {

const std::string kBin = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope";
const std::string kDat = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/pvm-user64-pio-mmio-hlt.dat";

using CmdResult = exitscope::test::Ran;

// `exitscope ARGS`, stdout and stderr together.
CmdResult Exec(const std::string& args) {
  return exitscope::test::RunExitscope(args);
}

class KvmCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kBin)) GTEST_SKIP() << "exitscope binary not built: " << kBin;
    ASSERT_TRUE(std::filesystem::exists(kDat)) << "committed capture missing: " << kDat;
  }
};

TEST_F(KvmCli, ReportOnTheCapture) {
  const CmdResult r = Exec("kvm report -i " + kDat + " --tsc-mhz 2596 --percentiles");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Analyze events for all VMs, all VCPUs:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("                  IO       3002 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("                MMIO       3000 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("                 HLT        200 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Total Samples:6202, Total events handled time:"), std::string::npos);
  EXPECT_NE(r.out.find("3 exits without an end"), std::string::npos) << r.out;
}

TEST_F(KvmCli, JsonIoport) {
  const CmdResult r =
      Exec("kvm report -i " + kDat + " --tsc-mhz 2596 --event ioport --format json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["event"], "ioport");
  ASSERT_EQ(j["all"]["rows"].size(), 2u);
  EXPECT_EQ(j["all"]["rows"][0]["key"], "0x3f8:POUT");
  EXPECT_EQ(j["all"]["rows"][0]["samples"], 3000);
  EXPECT_EQ(j["pairing"]["records"]["kvm_pio"], 3003);
}

TEST_F(KvmCli, BadInputAndUsageExitTwoWithOneLine) {
  const std::vector<std::string> cases = {
      "kvm report -i /nonexistent.dat",
      "kvm report -i " + kDat + " --event nope",
      "kvm report -i " + kDat + " --format xml",
      "kvm report",
      "kvm frobnicate",
      "kvm report -i " + std::string(EXITSCOPE_TESTDATA_DIR) +
          "/kvm/tracefs-pvm-6.18/events/header_page",
  };
  for (const std::string& args : cases) {
    const CmdResult r = Exec(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("exitscope kvm", 0), 0u) << args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << "\n" << r.out;
  }
}

const std::string kJointDat = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/joint-blk.dat";
const std::string kJointDump = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/joint-blk.esdump";

TEST_F(KvmCli, RealHostRunShowsOpenAtEndAndPortsByTheirOwnExits) {
  ASSERT_TRUE(std::filesystem::exists(kJointDat)) << "committed capture missing: " << kJointDat;
  const CmdResult r = Exec("kvm report -i " + kJointDat + " --tsc-mhz 2600 --event ioport " +
                           "--device-map " + kJointDump);
  ASSERT_EQ(r.status, 0) << r.out;
  // 62 LSR reads, each completed in the window after its exit; 63 THR writes.
  EXPECT_NE(r.out.find("           0x3fd:PIN         62 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("          0x3f8:POUT         63 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("uart0.LSR"), std::string::npos) << r.out;
  // The exit that ends each vCPU (the debug-exit port) never re-enters.
  EXPECT_NE(r.out.find("Open at end of trace: 2 exits"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("IO 0x500:POUT (debug0.EXIT), started and never re-entered"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("1442 exits paired"), std::string::npos) << r.out;

  const CmdResult j = Exec("kvm report -i " + kJointDat + " --tsc-mhz 2600 --format json");
  ASSERT_EQ(j.status, 0) << j.out;
  const auto json = nlohmann::json::parse(j.out);
  EXPECT_EQ(json["open_at_end_count"], 2);
  ASSERT_EQ(json["open_at_end"].size(), 2u);
  EXPECT_EQ(json["open_at_end"][0]["reason"], "IO");
  EXPECT_EQ(json["pairing"]["paired"], 1442);
  EXPECT_EQ(json["all"]["samples"], 1442);
}

TEST_F(KvmCli, ExitsWithoutEntriesGiveSamplesAndUnknownTimes) {
  const std::string path = ::testing::TempDir() + "/grep-kvm-exit.txt";
  {
    std::ofstream f(path);
    for (int i = 0; i < 3; ++i) {
      f << "  qemu-7 [000]  1.00000" << i << "000: kvm_exit: vcpu 0 reason HLT rip 0x1000 info1 "
        << "0x0 info2 0x0 intr_info 0x0 error_code 0x0\n";
    }
    f << "  qemu-7 [000]  1.000009000: kvm_exit: vcpu 0 reason NEW_REASON rip 0x1000 info1 0x0 "
         "info2 0x0 intr_info 0x0 error_code 0x0\n";
  }
  const CmdResult r = Exec("kvm report -i " + path);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("                 HLT          3    75.00%         -           -"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("          NEW_REASON          1    25.00%"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("UNKNOWN("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Time unknown: 4 exits"), std::string::npos) << r.out;
  const CmdResult j = Exec("kvm report -i " + path + " --format json");
  ASSERT_EQ(j.status, 0) << j.out;
  const auto json = nlohmann::json::parse(j.out);
  const auto& row = json["all"]["rows"][0];
  EXPECT_EQ(row["key"], "HLT");
  EXPECT_EQ(row["samples"], 3);
  EXPECT_EQ(row["untimed_samples"], 3);
  EXPECT_TRUE(row["min_ns"].is_null());
  ASSERT_FALSE(json["notes"].empty());
  EXPECT_NE(json["notes"][0].get<std::string>().find("Time unknown"), std::string::npos);
}

// A trace trimmed to its timestamps, as quoted in mails (testdata/kvm/README.md): read, and
// the input line says the threads are known only by their vcpu field.
TEST_F(KvmCli, TraceTrimmedToTimestampsSaysSoInTheInputLine) {
  const std::string path =
      std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/pvm-user64-pio-mmio-hlt-trimmed.txt";
  const CmdResult r = Exec("kvm report -i " + path + " --tsc-mhz 2596 --event ioport");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Input: " + path +
                       " (timestamp-only lines: threads known only by their vcpu field), 120 "
                       "records, 22 exits paired (0 kvm_exit->kvm_entry, 22 reached userspace), "
                       "1 open at end of trace"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("          0x3f8:POUT         22 "), std::string::npos) << r.out;
  const CmdResult j = Exec("kvm report -i " + path + " --tsc-mhz 2596 --format json");
  ASSERT_EQ(j.status, 0) << j.out;
  EXPECT_EQ(nlohmann::json::parse(j.out)["input"]["format"],
            "timestamp-only lines: threads known only by their vcpu field");
}

}  // namespace

// The report is the same byte for byte whichever way the .dat is read: the checked path on
// one thread (EXITSCOPE_DAT_FAST=0, EXITSCOPE_DAT_THREADS=1), the fast path on one thread,
// threads forced on (EXITSCOPE_DAT_THREADS=4: the real capture kDat is v7 zstd on two CPUs)
// reading time segments of one chunk (EXITSCOPE_DAT_SEGMENT_CHUNKS=1), or one decompressing
// thread per compressed CPU stream (=0), on every committed capture and in the text and JSON
// formats.
TEST_F(KvmCli, ReportIsTheSameWithAndWithoutTheFastPathAndThreads) {
  const std::string data = std::string(EXITSCOPE_TESTDATA_DIR);
  for (const std::string& dat :
       {kDat, data + "/kvm-host/joint-blk.dat", data + "/kvm-host/joint-sched.dat"}) {
    for (const std::string& opts :
         {std::string(" --percentiles"), std::string(" --format json --event ioport"),
          std::string(" --event mmio --vcpu 0")}) {
      SCOPED_TRACE(dat + opts);
      const std::string args = "kvm report -i " + dat + " --tsc-mhz 2596" + opts;
      const CmdResult base = exitscope::test::RunShell(
          "env EXITSCOPE_DAT_FAST=0 EXITSCOPE_DAT_THREADS=1 " + kBin + " " + args);
      ASSERT_EQ(base.status, 0) << base.out;
      ASSERT_FALSE(base.out.empty());
      for (const std::string& env :
           {std::string("EXITSCOPE_DAT_THREADS=1"),
            std::string("EXITSCOPE_DAT_THREADS=4 EXITSCOPE_DAT_SEGMENT_CHUNKS=1"),
            std::string("EXITSCOPE_DAT_THREADS=4 EXITSCOPE_DAT_SEGMENT_CHUNKS=0"),
            std::string("EXITSCOPE_DAT_FAST=0 EXITSCOPE_DAT_THREADS=4")}) {
        const CmdResult got = exitscope::test::RunShell("env " + env + " " + kBin + " " + args);
        EXPECT_EQ(got.status, 0) << env;
        EXPECT_EQ(got.out, base.out) << env;
      }
    }
  }
}
