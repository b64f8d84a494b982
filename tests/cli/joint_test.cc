// The joint view end to end: `exitscope inspect DUMP --kernel TRACE` and `exitscope kvm
// report -i TRACE --dump DUMP` on the real joint-blk capture (docs/joint.md).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "support/run.h"

namespace {

using Output = exitscope::test::Ran;
using exitscope::test::RunExitscope;

std::string Data(const char* rel) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/" + rel;
}

const std::string kDump = Data("kvm-host/joint-blk.esdump");
const std::string kTrace = Data("kvm-host/joint-blk.dat");

TEST(JointCli, InspectWithKernelPrintsTheJointTable) {
  const Output o = RunExitscope("inspect " + kDump + " --kernel " + kTrace);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("Joint view: " + kDump), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("converted with the dump's TSC calibration"), std::string::npos);
  EXPECT_NE(o.out.find("of 1444 VMM exits"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("By register"), std::string::npos);
  EXPECT_NE(o.out.find("Slowest 10 exits"), std::string::npos);
  EXPECT_NE(o.out.find("Unmatched VMM exits"), std::string::npos);
  EXPECT_NE(o.out.find("Unmatched kernel exits"), std::string::npos);
  EXPECT_NE(o.out.find("sched_switch"), std::string::npos);  // says what is not split
}

TEST(JointCli, KvmReportWithDumpGivesTheSameView) {
  for (const char* fmt : {"table", "json"}) {
    const Output a =
        RunExitscope("inspect " + kDump + " --kernel " + kTrace + " --format " + fmt, false);
    const Output b =
        RunExitscope("kvm report -i " + kTrace + " --dump " + kDump + " --format " + fmt, false);
    ASSERT_EQ(a.status, 0) << a.out;
    ASSERT_EQ(b.status, 0) << b.out;
    EXPECT_EQ(a.out, b.out) << fmt;
  }
}

TEST(JointCli, JsonHasTheDocumentedFieldsAndEveryMatchedExit) {
  const Output o =
      RunExitscope("inspect " + kDump + " --kernel " + kTrace + " --format json", false);
  ASSERT_EQ(o.status, 0) << o.out;
  const nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["schema"], "exitscope.joint.v1");
  const nlohmann::json& v = j["joint"];
  for (const char* k :
       {"dump", "trace", "clock", "vcpu_threads", "vmm_exits", "kernel_exits", "matched",
        "unmatched_vmm", "unmatched_kernel", "offset_ns", "not_split", "by_kind", "by_device",
        "by_register", "slow_exits", "exits", "exits_left_out", "warnings"}) {
    EXPECT_TRUE(v.contains(k)) << k;
  }
  EXPECT_EQ(v["clock"]["tsc_hz_from"], "dump");
  EXPECT_EQ(v["vcpu_threads"]["method"], "thread-by-time");
  EXPECT_EQ(v["vmm_exits"], 1444);
  const uint64_t matched = v["matched"];
  EXPECT_GE(matched, 1440u);
  EXPECT_EQ(v["exits"].size(), matched);  // the default lists all of joint-blk
  EXPECT_EQ(v["exits_left_out"], 0);
  EXPECT_EQ(matched + v["unmatched_vmm"]["count"].get<uint64_t>(), 1444u);
  EXPECT_EQ(matched + v["unmatched_kernel"]["count"].get<uint64_t>(),
            v["kernel_exits"].get<uint64_t>());
  for (const char* side : {"unmatched_vmm", "unmatched_kernel"}) {
    uint64_t by_reason = 0;
    for (const auto& r : v[side]["reasons"]) by_reason += r["count"].get<uint64_t>();
    EXPECT_EQ(by_reason, v[side]["count"].get<uint64_t>()) << side;
    EXPECT_EQ(v[side]["exits"].size(), v[side]["count"].get<uint64_t>()) << side;
    for (const auto& e : v[side]["exits"]) EXPECT_FALSE(e["reason"].get<std::string>().empty());
  }
  for (const auto& e : v["exits"]) {
    EXPECT_EQ(e["kernel_before_ns"].get<uint64_t>() + e["handler_ns"].get<uint64_t>() +
                  e["kernel_after_ns"].get<uint64_t>(),
              e["kernel_ns"].get<uint64_t>());
  }
  const int64_t med = v["offset_ns"]["median"], max = v["offset_ns"]["max"];
  EXPECT_GT(med, 0);
  EXPECT_GE(max, med);
  ASSERT_FALSE(v["by_register"].empty());
  for (const char* k : {"key", "count", "kernel", "kernel_before", "handler", "kernel_after"}) {
    EXPECT_TRUE(v["by_register"][0].contains(k)) << k;
  }
  EXPECT_TRUE(v["by_register"][0]["handler"].contains("share_p99"));
}

TEST(JointCli, ClocksThatCannotBeAlignedAreRefusedWithOneLine) {
  // Another run's trace: no overlap in time, or not an x86-tsc trace.
  for (const char* other : {"kvm/pvm-user64-pio-mmio-hlt.dat", "kvm/pvm-user64-pio-mmio-hlt.txt"}) {
    const Output o = RunExitscope("inspect " + kDump + " --kernel " + Data(other));
    EXPECT_EQ(o.status, 2) << other << ": " << o.out;
    EXPECT_EQ(o.out.find('\n'), o.out.size() - 1) << o.out;  // one line
    EXPECT_NE(o.out.find("exitscope inspect: "), std::string::npos) << o.out;
  }
}

TEST(JointCli, MissingFilesAndBadFlagsAreRefused) {
  // A trace that cannot be opened: the status `kvm report -i` gives for it (an I/O error).
  Output o = RunExitscope("inspect " + kDump + " --kernel /nonexistent/x.dat");
  EXPECT_NE(o.status, 0) << o.out;
  EXPECT_EQ(o.status, RunExitscope("kvm report -i /nonexistent/x.dat").status);
  EXPECT_NE(o.out.find("/nonexistent/x.dat"), std::string::npos) << o.out;
  o = RunExitscope("kvm report -i " + kTrace + " --dump /nonexistent/x.esdump");
  EXPECT_NE(o.status, 0) << o.out;
  EXPECT_EQ(o.status, RunExitscope("inspect /nonexistent/x.esdump").status);
  EXPECT_NE(o.out.find("--dump"), std::string::npos) << o.out;
  o = RunExitscope("kvm report -i " + kTrace + " --dump " + kDump + " --format svg");
  EXPECT_EQ(o.status, 2) << o.out;
  o = RunExitscope("inspect " + kDump + " --kernel " + kTrace + " --vcpu 0");
  EXPECT_EQ(o.status, 2) << o.out;
}

TEST(JointCli, WithoutTheFlagsBothCommandsKeepTheirReports) {
  Output o = RunExitscope("inspect " + kDump, false);
  EXPECT_EQ(o.status, 0);
  EXPECT_EQ(o.out.find("Joint view"), std::string::npos);
  o = RunExitscope("kvm report -i " + kTrace, false);
  EXPECT_EQ(o.status, 0);
  EXPECT_NE(o.out.find("VM-EXIT"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("Joint view"), std::string::npos);
}

}  // namespace
