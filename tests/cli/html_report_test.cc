// `--format html` (docs/html-report.md) without a browser: usage errors, and what the page's
// data block says, checked against the JSON report of the same input (the page draws the
// same rows: every histogram series counts its row's exits, the timeline counts every exit,
// the joint split's parts add up to 100%). The page itself in Chromium: html_chromium_test.cc.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/run.h"

namespace {

using Output = exitscope::test::Ran;
using exitscope::test::RunExitscope;

std::string Data(const char* rel) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/" + rel;
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string OutFile(const std::string& name) {
  return std::string(EXITSCOPE_BINARY_DIR) + "/test-artefacts/html/" + name;
}

// Renders `args` into OutFile(name); "SKIP:why" when this build has no plotting library.
std::string Render(const std::string& args, const std::string& name) {
  std::system(("mkdir -p " + std::string(EXITSCOPE_BINARY_DIR) + "/test-artefacts/html").c_str());
  const std::string file = OutFile(name);
  const Output o = RunExitscope(args + " --format html -o " + file);
  if (o.status == 1 && o.out.find("plotting library is not in this build") != std::string::npos)
    return "SKIP:" + o.out;
  EXPECT_EQ(o.status, 0) << o.out;
  EXPECT_EQ(o.out, "");  // nothing on stdout or stderr
  return Slurp(file);
}

// Skips with `why` where this build has no plotting library (its npm step failed), but fails
// in a build that requires it (-DEXITSCOPE_REQUIRE_HTML=ON, as CI builds).
#ifdef EXITSCOPE_REQUIRE_HTML
#define SKIP_WITHOUT_HTML(why) FAIL() << (why) << " (the build requires the HTML report)"
#else
#define SKIP_WITHOUT_HTML(why) GTEST_SKIP() << (why)
#endif

#define RENDER_OR_SKIP(var, args, name)                             \
  const std::string var = Render(args, name);                       \
  if (var.rfind("SKIP:", 0) == 0) SKIP_WITHOUT_HTML(var.substr(5)); \
  ASSERT_FALSE(var.empty())

// The page's data block.
nlohmann::json PageData(const std::string& html) {
  const std::string open = "<script id=\"es-data\" type=\"application/json\">";
  const size_t a = html.find(open);
  const size_t b = html.find("</script>", a);
  EXPECT_NE(a, std::string::npos);
  return nlohmann::json::parse(html.substr(a + open.size(), b - a - open.size()));
}

const nlohmann::json& Chart(const nlohmann::json& d, const std::string& id) {
  for (const auto& c : d["charts"])
    if (c["id"] == id) return c;
  static const nlohmann::json none;
  ADD_FAILURE() << "no chart " << id;
  return none;
}

uint64_t SeriesSum(const nlohmann::json& s) {
  uint64_t n = 0;
  for (const auto& v : s["data"])
    if (!v.is_null()) n += v.get<uint64_t>();
  return n;
}

TEST(HtmlReport, HtmlNeedsAnOutputFile) {
  Output o = RunExitscope("inspect " + Data("blk-backend-delay.esdump") + " --format html");
  EXPECT_EQ(o.status, 2) << o.out;
  EXPECT_NE(o.out.find("--format html: give the page's file with -o FILE"), std::string::npos);
  o = RunExitscope("kvm report -i " + Data("joint-blk.dat") + " --format html");
  EXPECT_EQ(o.status, 2) << o.out;
  EXPECT_NE(o.out.find("-o FILE"), std::string::npos) << o.out;
  o = RunExitscope("kvm report -i " + Data("joint-blk.dat") + " --format svg");
  EXPECT_EQ(o.status, 2) << o.out;
  EXPECT_NE(o.out.find("--format 'svg': not one of table, json, csv, html, timeline"),
            std::string::npos)
      << o.out;
}

TEST(HtmlReport, UnwritableOutputIsOneLineAndStatus1) {
  const Output o = RunExitscope("inspect " + Data("blk-backend-delay.esdump") +
                                " --format html -o /nonexistent-dir/r.html");
  if (o.out.find("plotting library is not in this build") != std::string::npos)
    SKIP_WITHOUT_HTML(o.out);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.out.find("-o /nonexistent-dir/r.html: cannot create"), std::string::npos) << o.out;
  EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 1) << o.out;
}

TEST(HtmlReport, InspectPageDrawsTheReportsRows) {
  const std::string dump = Data("blk-backend-delay.esdump");
  RENDER_OR_SKIP(html, "inspect " + dump, "unit-blk.html");
  // Self-contained: no external script, style, link or frame; every request refused by CSP.
  for (const char* bad : {"<script src", "<link", "<iframe", "<img src=\"http"})
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  EXPECT_NE(html.find("Content-Security-Policy\" content=\"default-src 'none'"), std::string::npos);
  EXPECT_NE(html.find("Apache License"), std::string::npos);  // the library's licence inlined

  const Output j = RunExitscope("inspect " + dump + " --format json", false);
  ASSERT_EQ(j.status, 0);
  const nlohmann::json report = nlohmann::json::parse(j.out);
  const nlohmann::json d = PageData(html);
  // Histograms: one series per row (up to 10, most exits first), counting the row's exits.
  for (const auto& [id, group] :
       {std::pair{"hist-kind", "by_kind"}, std::pair{"hist-device", "by_device"},
        std::pair{"hist-register", "by_register"}}) {
    const nlohmann::json& c = Chart(d, id);
    ASSERT_FALSE(c["series"].empty()) << id;
    EXPECT_EQ(c["series"].size() + c["left_out"].get<size_t>(), report[group].size()) << id;
    for (const auto& s : c["series"]) {
      bool found = false;
      for (const auto& row : report[group]) {
        if (row["key"] != s["name"]) continue;
        found = true;
        EXPECT_EQ(SeriesSum(s), row["count"].get<uint64_t>()) << id << " " << s["name"];
      }
      EXPECT_TRUE(found) << id << " " << s["name"];
      EXPECT_EQ(s["data"].size(), c["categories"].size());
    }
  }
  // Register names are device.register.
  EXPECT_NE(Chart(d, "hist-register").dump().find("nvme0.SQ1TDBL write"), std::string::npos);
  // Timeline: one track per vCPU; every slow exit drawn and marked; the page says how many
  // exits were drawn of how many (all of them: far below the bound).
  const nlohmann::json& t = Chart(d, "timeline");
  ASSERT_EQ(t["tracks"].size(), 2u);
  EXPECT_EQ(t["tracks"][0]["name"], "vCPU 0");
  size_t drawn = 0, slow = 0;
  for (const auto& tr : t["tracks"]) {
    drawn += tr["normal"].size() + tr["slow"].size();
    slow += tr["slow"].size();
    for (const auto& p : tr["slow"]) EXPECT_GE(p[1].get<double>(), 20000.0);  // >= 20 ms
  }
  size_t report_slow = 0;
  for (const auto& e : report["slow_exits"]) report_slow += e["in_progress"] ? 0 : 1;
  EXPECT_EQ(slow, report_slow);
  const uint64_t exits = report["exits"];
  EXPECT_LE(drawn, exits);
  EXPECT_NE(html.find(std::to_string(drawn) + " of " + std::to_string(exits) + " exits drawn"),
            std::string::npos);
  // Rate: per vCPU, every exit counted once.
  const nlohmann::json& r = Chart(d, "rate");
  double per_bin_total = 0;
  const double width =
      r["series"][0]["data"][1][0].get<double>() - r["series"][0]["data"][0][0].get<double>();
  for (size_t k = 0; k < 2; ++k)
    for (const auto& p : r["series"][k]["data"]) per_bin_total += p[1].get<double>() * width;
  EXPECT_NEAR(per_bin_total, static_cast<double>(exits), exits * 0.01);
  // The tables: the text report's.
  EXPECT_NE(html.find("<h3>Exits by register</h3>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"k\">nvme0.SQ1TDBL write</td>"), std::string::npos);
}

TEST(HtmlReport, JointPageSplitsAddUpTo100Percent) {
  RENDER_OR_SKIP(html,
                 "inspect " + Data("joint-sched.esdump") + " --kernel " + Data("joint-sched.dat"),
                 "unit-joint.html");
  const nlohmann::json d = PageData(html);
  for (const char* id : {"split-kind", "split-device", "split-register"}) {
    const nlohmann::json& c = Chart(d, id);
    ASSERT_FALSE(c["categories"].empty()) << id;
    ASSERT_EQ(c["parts"].size(), 4u) << id;  // the capture recorded sched_switch: off-CPU
    for (size_t i = 0; i < c["categories"].size(); ++i) {
      double sum = 0;
      for (const auto& p : c["parts"]) sum += p["share"][i].get<double>();
      EXPECT_NEAR(sum, 100.0, 0.1) << id << " " << c["categories"][i];
    }
  }
  EXPECT_EQ(Chart(d, "split-kind")["parts"][3]["name"], "off-CPU");
}

TEST(HtmlReport, KvmReportPageDrawsTheClassRows) {
  const std::string args = "kvm report -i " + Data("joint-blk.dat") +
                           " --event ioport --device-map " + Data("joint-blk.esdump");
  RENDER_OR_SKIP(html, args, "unit-kvm.html");
  const Output j = RunExitscope(args + " --format json", false);
  ASSERT_EQ(j.status, 0);
  const nlohmann::json report = nlohmann::json::parse(j.out);
  const nlohmann::json d = PageData(html);
  const nlohmann::json& c = Chart(d, "hist-key");
  ASSERT_FALSE(c["series"].empty());
  // The class has 6 rows, fewer than the plot's series: every row is drawn (none left out),
  // each series counts its row's timed exits, and together they count every timed exit.
  const nlohmann::json& rows = report["all"]["rows"];
  ASSERT_EQ(c["left_out"].get<size_t>(), 0u);
  ASSERT_EQ(c["series"].size(), rows.size());
  uint64_t timed = 0;
  for (const auto& row : rows) {
    timed += row["timed_samples"].get<uint64_t>();
    const std::string key = row["key"], name = row["name"];
    const std::string series = name.empty() || name == key ? key : key + " (" + name + ")";
    bool found = false;
    for (const auto& s : c["series"]) {
      if (s["name"] != series) continue;
      found = true;
      EXPECT_EQ(SeriesSum(s), row["timed_samples"].get<uint64_t>()) << series;
    }
    EXPECT_TRUE(found) << series;
  }
  uint64_t drawn = 0;
  for (const auto& s : c["series"]) drawn += SeriesSum(s);
  EXPECT_EQ(drawn, timed);
  // The timeline holds the class's exits only: port exits, named by device.register.
  const nlohmann::json& t = Chart(d, "timeline");
  for (const auto& label : t["labels"])
    EXPECT_NE(label.get<std::string>().find(" uart0."), std::string::npos) << label;
}

}  // namespace
