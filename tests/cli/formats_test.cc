// One pipeline, every output format: `inspect`, `kvm report` and `run` offer the same five
// formats (report/renderer.h), `kvm live` and `kvm stat` the live three (`kvm stat --bpf
// --stacks` also html and timeline, for its final report); an unknown format is
// one line naming the choices; inspect reads a kernel trace and kvm report a dump.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
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
const char* kAll = "not one of table, json, csv, html, timeline";

int Lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string Temp(const char* name) {
  return testing::TempDir() + "/formats_" + std::to_string(getpid()) + "_" + name;
}

TEST(Formats, AnUnknownFormatIsOneLineNamingTheSameChoicesEverywhere) {
  for (const std::string& cmd :
       {"inspect " + kDump, "kvm report -i " + kTrace, "inspect " + kDump + " --kernel " + kTrace,
        std::string("run --guest hello")}) {
    SCOPED_TRACE(cmd);
    const Output o = RunExitscope(cmd + " --format xml");
    EXPECT_EQ(o.status, 2) << o.out;
    EXPECT_EQ(Lines(o.out), 1) << o.out;
    EXPECT_NE(o.out.find(std::string("--format 'xml': ") + kAll), std::string::npos) << o.out;
  }
  const Output live = RunExitscope("kvm live --stop-after 1 --format html");
  EXPECT_EQ(live.status, 2) << live.out;
  EXPECT_EQ(Lines(live.out), 1) << live.out;
  EXPECT_NE(live.out.find("--format 'html': not one of table, json, csv"), std::string::npos)
      << live.out;
  // kvm stat writes html and timeline only as the final report of --bpf --stacks.
  const Output stat = RunExitscope("kvm stat --duration 1 --format html");
  EXPECT_EQ(stat.status, 2) << stat.out;
  EXPECT_EQ(Lines(stat.out), 1) << stat.out;
  EXPECT_NE(stat.out.find("--format html needs --bpf --stacks"), std::string::npos) << stat.out;
  const Output xml = RunExitscope("kvm stat --duration 1 --format xml");
  EXPECT_EQ(xml.status, 2) << xml.out;
  EXPECT_EQ(Lines(xml.out), 1) << xml.out;
  EXPECT_NE(xml.out.find("--format 'xml': not one of table, json, csv"), std::string::npos)
      << xml.out;
}

TEST(Formats, FileFormatsNeedAnOutputFile) {
  for (const std::string& cmd : {"inspect " + kDump, "kvm report -i " + kTrace,
                                 "inspect " + kDump + " --kernel " + kTrace}) {
    for (const char* f : {"html", "timeline"}) {
      SCOPED_TRACE(cmd + " " + f);
      const Output o = RunExitscope(cmd + " --format " + f);
      EXPECT_EQ(o.status, 2) << o.out;
      EXPECT_NE(o.out.find("-o FILE"), std::string::npos) << o.out;
    }
  }
}

TEST(Formats, InspectReadsAKernelTraceAsKvmReportDoes) {
  const Output a = RunExitscope("inspect " + kTrace + " --format json", false);
  const Output b = RunExitscope("kvm report -i " + kTrace + " --format json", false);
  ASSERT_EQ(a.status, 0) << a.out;
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_EQ(a.out, b.out);  // the same source, analysis and renderer
  const nlohmann::json j = nlohmann::json::parse(a.out);
  EXPECT_EQ(j["input"]["format"], "trace-cmd .dat") << a.out.substr(0, 400);
  const Output dev = RunExitscope("inspect " + kTrace + " --device nvme0");
  EXPECT_EQ(dev.status, 2) << dev.out;
  EXPECT_NE(dev.out.find("a kernel trace, not a dump"), std::string::npos) << dev.out;
}

TEST(Formats, KvmReportReadsADumpsExitsAsTheVmmSawThem) {
  const Output o = RunExitscope("kvm report -i " + kDump + " --format json", false);
  ASSERT_EQ(o.status, 0) << o.out;
  const nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["input"]["format"], "recorder dump");
  uint64_t samples = 0;
  for (const auto& r : j["all"]["rows"]) samples += r["count"].get<uint64_t>();
  EXPECT_FALSE(j.contains("pairing"));  // nothing was paired
  // joint-blk.esdump: 1444 exits that ended (HLT, MMIO, PIO), as `inspect` counts them.
  EXPECT_EQ(samples, 1444u) << o.out.substr(0, 2000);
  const Output csv = RunExitscope("kvm report -i " + kDump + " --format csv --event mmio", false);
  ASSERT_EQ(csv.status, 0) << csv.out;
  EXPECT_NE(csv.out.find("nvme0"), std::string::npos) << csv.out;
  const Output table = RunExitscope("kvm report -i " + kDump, false);
  EXPECT_NE(table.out.find("(recorder dump), 1444 exits as the VMM recorded them"),
            std::string::npos)
      << table.out;
}

TEST(Formats, EveryReportInEveryFileFormat) {
  const std::string out = Temp("x");
  for (const std::string& cmd :
       {"inspect " + kDump, "kvm report -i " + kTrace, "inspect " + kDump + " --kernel " + kTrace,
        "kvm report -i " + kDump}) {
    for (const char* f : {"table", "json", "csv", "timeline"}) {
      SCOPED_TRACE(cmd + " --format " + f);
      std::remove(out.c_str());
      const Output o = RunExitscope(cmd + " --format " + f + " -o " + out);
      ASSERT_EQ(o.status, 0) << o.out;
      const std::string text = Slurp(out);
      ASSERT_FALSE(text.empty());
      if (std::string(f) == "json" || std::string(f) == "timeline") {
        nlohmann::json j;
        ASSERT_NO_THROW(j = nlohmann::json::parse(text));
        if (std::string(f) == "timeline") {
          EXPECT_GT(j["traceEvents"].size(), 100u);
        }
      }
      if (std::string(f) == "csv") {
        EXPECT_EQ(text.rfind("scope,", 0), 0u) << text;
      }
    }
  }
  std::remove(out.c_str());
}

// The timeline of inspect --kernel is the one `exitscope timeline DUMP TRACE` writes.
TEST(Formats, TheJointTimelineIsTheTimelineCommands) {
  const std::string a = Temp("a.json"), b = Temp("b.json");
  ASSERT_EQ(RunExitscope("inspect " + kDump + " --kernel " + kTrace + " --format timeline -o " + a)
                .status,
            0);
  ASSERT_EQ(RunExitscope("timeline " + kDump + " " + kTrace + " -o " + b).status, 0);
  EXPECT_EQ(Slurp(a), Slurp(b));
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST(Formats, RunWritesItsReportInAnyFormat) {
  SKIP_WITHOUT_KVM();
  const std::string out = Temp("run.csv");
  const Output o = RunExitscope("run --guest hello --no-dump --format csv -o " + out);
  ASSERT_EQ(o.status, 0) << o.out;
  const std::string csv = Slurp(out);
  EXPECT_EQ(csv.rfind("scope,vm,vcpu,key,name,samples", 0), 0u) << csv;
  EXPECT_NE(csv.find("\nkind,,,PIO,"), std::string::npos) << csv;
  const Output t = RunExitscope("run --guest hello --no-dump --format timeline -o " + out);
  ASSERT_EQ(t.status, 0) << t.out;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(Slurp(out)));
  EXPECT_FALSE(j["traceEvents"].empty());
  std::remove(out.c_str());
}

}  // namespace
