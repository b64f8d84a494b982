// The diagnosis every report opens with, end to end through the binary, on the real captures of
// testdata/kvm-host: `inspect` of the demo's dump (what `make demo` shows without /dev/kvm), the
// joint view, `kvm report`, JSON and HTML. The figures in the words are checked against the
// JSON's own numbers, which tests/analysis/diagnosis_test.cc checks against the events.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/run.h"

namespace {

using exitscope::test::RunExitscope;

std::string KvmHost(const char* f) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/" + f;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The first line that starts with `prefix`, its index (or -1).
int LineOf(const std::vector<std::string>& lines, const std::string& prefix) {
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i].rfind(prefix, 0) == 0) return static_cast<int>(i);
  return -1;
}

// `make demo` without /dev/kvm: the answer first, in a screen, naming both doorbells, each
// vCPU's share and the I/O in flight; the detailed tables after it.
TEST(DiagnosisCli, TheDemoDumpOpensWithTheAnswer) {
  const std::string dump = KvmHost("blk-backend-delay.esdump");
  const auto t = RunExitscope("inspect " + dump, false);
  ASSERT_EQ(t.status, 0) << t.err;
  const auto j = RunExitscope("inspect --format json " + dump, false);
  ASSERT_EQ(j.status, 0) << j.err;
  const nlohmann::json d = nlohmann::json::parse(j.out).at("diagnosis");

  const std::vector<std::string> lines = Lines(t.out);
  const int diag = LineOf(lines, "Diagnosis: ");
  const int tables = LineOf(lines, "Exits by kind");
  ASSERT_GE(diag, 0) << t.out;
  ASSERT_GT(tables, diag) << t.out;
  EXPECT_LE(tables, 60) << "the answer does not fit in a screen:\n" << t.out;
  const std::string& head = lines[diag];
  EXPECT_NE(head.find("nvme0.SQ2TDBL write / nvme0.SQ1TDBL write"), std::string::npos) << head;
  EXPECT_NE(head.find("with an nvme0 I/O in flight"), std::string::npos) << head;
  EXPECT_EQ(d.at("headline").get<std::string>(), head.substr(11));
  // Each vCPU's share, as the JSON's figures give it.
  const uint64_t span = d.at("span_ns").get<uint64_t>();
  ASSERT_EQ(d.at("vcpus").size(), 2u);
  for (const auto& v : d.at("vcpus")) {
    const double share = static_cast<double>(v.at("lost_ns").get<uint64_t>()) / span;
    EXPECT_DOUBLE_EQ(v.at("share").get<double>(), share);
    EXPECT_NE(
        head.find(fmt::format("vCPU {} lost {:.1f} %", v.at("vcpu").get<int>(), share * 100.0)),
        std::string::npos)
        << head;
  }
  // The causes, ranked, with their evidence; the rest collapsed into one line.
  const auto& c = d.at("causes");
  ASSERT_GE(c.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(c[i].at("slow").get<bool>());
    EXPECT_EQ(c[i].at("evidence")[0].at("kind"), "io-in-flight");
    EXPECT_EQ(c[i].at("next").get<std::string>(),
              "exitscope inspect " + dump + " --events --device nvme0");
    EXPECT_NE(t.out.find(fmt::format("{:>4}. {}, slow: {} exits", i + 1,
                                     c[i].at("cause").get<std::string>(),
                                     c[i].at("count").get<uint64_t>())),
              std::string::npos)
        << t.out;
  }
  EXPECT_NE(t.out.find("more causes: "), std::string::npos) << t.out;
  // Repeats collapse: one line per slow cause; --events lists each exit.
  EXPECT_NE(t.out.find("Slow exits (>= 20.00 ms): 23, 2 causes (--events lists each exit)"),
            std::string::npos)
      << t.out;
  EXPECT_EQ(t.out.find("took 300"), std::string::npos) << t.out;
  const auto e = RunExitscope("inspect --events " + dump, false);
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_NE(e.out.find("vCPU 0: exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008) took 300.55 ms"),
            std::string::npos)
      << e.out;
  EXPECT_NE(e.out.find("      in flight: nvme0 io 64 for 21.55 ms"), std::string::npos);
  EXPECT_LT(Lines(t.out).size(), Lines(e.out).size());
  // JSON lists every slow exit whatever the text shows.
  EXPECT_EQ(nlohmann::json::parse(j.out).at("slow_exits").size(), 23u);
}

// Where the watchdog captured the stuck thread, the answer names its blocking call and the
// VMM's own frame (the C example's handler asleep in nanosleep).
TEST(DiagnosisCli, TheAnswerNamesTheStuckThreadsBlockingFrame) {
  const auto t = RunExitscope(
      "inspect " + std::string(EXITSCOPE_TESTDATA_DIR) + "/dumps/v4-c-example-stacks.esdump",
      false);
  ASSERT_EQ(t.status, 0) << t.err;
  const std::vector<std::string> lines = Lines(t.out);
  const int diag = LineOf(lines, "Diagnosis: ");
  ASSERT_GE(diag, 0) << t.out;
  EXPECT_NE(lines[diag].find("1 slow nvme0.SQ1TDBL write exit"), std::string::npos) << lines[diag];
  EXPECT_NE(lines[diag].find("with an nvme0 I/O in flight; the thread blocked in __nanosleep "
                             "from main (c_example.c:52)"),
            std::string::npos)
      << lines[diag];
  EXPECT_NE(t.out.find("evidence: the stuck thread's stack (1 of 1, state S): blocked in "
                       "__nanosleep (kernel hrtimer_nanosleep) from main (c_example.c:52)"),
            std::string::npos)
      << t.out;
}

// Nothing slow, nothing stuck: one line says so.
TEST(DiagnosisCli, AllWellIsOneLine) {
  const auto t = RunExitscope("inspect " + KvmHost("mmio-storm.esdump"), false);
  ASSERT_EQ(t.status, 0) << t.err;
  const std::vector<std::string> lines = Lines(t.out);
  const int diag = LineOf(lines, "Diagnosis: all well: ");
  ASSERT_GE(diag, 0) << t.out;
  EXPECT_TRUE(lines[diag + 1].empty()) << t.out;
  EXPECT_NE(lines[diag].find("none slow, none stuck"), std::string::npos) << lines[diag];
}

// The joint view: the slow doorbells' time was the vCPU thread off the CPU (sched_switch).
TEST(DiagnosisCli, TheJointViewSaysTheThreadWasOffTheCpu) {
  const auto t = RunExitscope(
      "inspect " + KvmHost("joint-sched.esdump") + " --kernel " + KvmHost("joint-sched.dat"),
      false);
  ASSERT_EQ(t.status, 0) << t.err;
  const std::vector<std::string> lines = Lines(t.out);
  const int diag = LineOf(lines, "Diagnosis: ");
  ASSERT_GE(diag, 0) << t.out;
  EXPECT_LT(diag, LineOf(lines, "By kind")) << t.out;
  EXPECT_NE(lines[diag].find("nvme0.SQ"), std::string::npos) << lines[diag];
  EXPECT_NE(lines[diag].find("the vCPU thread blocked off the CPU"), std::string::npos)
      << lines[diag];
  const auto j = RunExitscope("inspect --format json " + KvmHost("joint-sched.esdump") +
                                  " --kernel " + KvmHost("joint-sched.dat"),
                              false);
  ASSERT_EQ(j.status, 0) << j.err;
  const nlohmann::json d = nlohmann::json::parse(j.out).at("joint").at("diagnosis");
  EXPECT_EQ(d.at("causes")[0].at("evidence")[0].at("kind"), "off-cpu");
}

// kvm report of a kernel trace opens with the diagnosis too, slow at 20 ms by default.
TEST(DiagnosisCli, KvmReportOpensWithTheDiagnosis) {
  const auto t = RunExitscope("kvm report -i " + KvmHost("joint-blk.dat"), false);
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_EQ(t.out.rfind("Diagnosis: ", 0), 0u) << t.out;
  EXPECT_NE(t.out.find("slow MMIO exits"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("reached the VMM"), std::string::npos) << t.out;
  const auto j = RunExitscope("kvm report --format json -i " + KvmHost("joint-blk.dat"), false);
  ASSERT_EQ(j.status, 0) << j.err;
  const nlohmann::json d = nlohmann::json::parse(j.out).at("diagnosis");
  EXPECT_EQ(d.at("schema"), "exitscope.diagnosis.v1");
  EXPECT_EQ(d.at("causes")[0].at("cause"), "MMIO");
  EXPECT_TRUE(d.at("causes")[0].at("slow").get<bool>());
}

// The HTML page opens with the diagnosis, linking to the evidence.
TEST(DiagnosisCli, TheHtmlPageOpensWithTheDiagnosisAndLinksTheEvidence) {
  const std::string out = testing::TempDir() + "/diagnosis_" + std::to_string(::getpid()) + ".html";
  const auto h =
      RunExitscope("inspect --format html -o " + out + " " + KvmHost("blk-backend-delay.esdump"));
  ASSERT_EQ(h.status, 0) << h.out;
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string page = ss.str();
  std::remove(out.c_str());
  const size_t diag = page.find("<h2 id=\"s-diagnosis\">Diagnosis</h2>");
  ASSERT_NE(diag, std::string::npos);
  EXPECT_LT(diag, page.find("<h2 id=\"s-histograms\">"));
  EXPECT_NE(page.find("<a href=\"#s-timeline\">"), std::string::npos);
  EXPECT_NE(page.find("nvme0.SQ2TDBL write (slow)"), std::string::npos);
}

}  // namespace
