// The HTML report in a real browser (docs/html-report.md): each page is loaded in headless
// Chromium (Debian's /usr/bin/chromium, driven by playwright-core from web/package.json,
// installed into build/web by the build) through web/check_page.cjs. Checks: the page loads
// with no console error, no page error and no network request; every plot reported drawn
// (ECharts' 'finished' event sets data-drawn="1") and its canvas holds painted pixels; the
// tables are there. A full-page screenshot of each is kept in
// build/test-artefacts/html/<name>.png. Skips with the reason when chromium, node,
// playwright-core or the plotting library is missing (the last two fail instead in a build
// with -DEXITSCOPE_REQUIRE_HTML=ON). Label: chromium.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "support/run.h"

namespace {

constexpr const char* kChromium = "/usr/bin/chromium";

using Output = exitscope::test::Ran;

// `sh -c CMD`, stdout and stderr together.
Output Run(const std::string& cmd) {
  return exitscope::test::RunShell(cmd);
}

std::string Data(const char* rel) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/" + rel;
}

bool Exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

const std::string kBin = EXITSCOPE_BINARY_DIR;
const std::string kModules = kBin + "/web/node_modules";
const std::string kArtefacts = kBin + "/test-artefacts/html";

// Skips with `why` where the build's npm step failed (no plotting library, no
// playwright-core), but fails in a build that requires it (-DEXITSCOPE_REQUIRE_HTML=ON, as CI
// builds). A missing chromium or node is the host's and always skips.
#ifdef EXITSCOPE_REQUIRE_HTML
#define SKIP_WITHOUT_HTML(why) FAIL() << (why) << " (the build requires the HTML report)"
#else
#define SKIP_WITHOUT_HTML(why) GTEST_SKIP() << (why)
#endif

// Why the browser check cannot run here, or "" when it can.
std::string MissingPrerequisite() {
  if (::access(kChromium, X_OK) != 0)
    return std::string(kChromium) + " is not installed (scripts/install-deps.sh installs chromium)";
  if (Run("node --version").status != 0)
    return "node is not installed (scripts/install-deps.sh installs nodejs and npm)";
  return "";
}

// Why the build's npm step left playwright-core out, or "" when it is there.
std::string MissingModules() {
  if (!Exists(kModules + "/playwright-core/package.json"))
    return kModules +
           "/playwright-core is missing: `npm ci` of web/package-lock.json failed or "
           "did not run at build time (offline?)";
  return "";
}

// Renders `args` into a page, loads it in Chromium, checks it; returns the checker's JSON.
void CheckPage(const std::string& args, const std::string& name, size_t min_charts) {
  if (const std::string why = MissingPrerequisite(); !why.empty()) GTEST_SKIP() << why;
  if (const std::string why = MissingModules(); !why.empty()) SKIP_WITHOUT_HTML(why);
  Run("mkdir -p " + kArtefacts);
  const std::string page = kArtefacts + "/" + name + ".html";
  const std::string shot = kArtefacts + "/" + name + ".png";
  std::remove(shot.c_str());
  const Output r = Run(kBin + "/exitscope " + args + " --format html -o " + page);
  if (r.status == 1 && r.out.find("plotting library is not in this build") != std::string::npos)
    SKIP_WITHOUT_HTML(r.out);
  ASSERT_EQ(r.status, 0) << r.out;
  const Output c =
      Run("node " + std::string(EXITSCOPE_SOURCE_DIR) + "/web/check_page.cjs --modules " +
          kModules + " --page " + page + " --screenshot " + shot + " --chromium " + kChromium);
  ASSERT_EQ(c.status, 0) << c.out;
  const nlohmann::json j = nlohmann::json::parse(c.out.substr(c.out.find('{')));
  EXPECT_TRUE(j["console_errors"].empty()) << j["console_errors"].dump();
  EXPECT_TRUE(j["page_errors"].empty()) << j["page_errors"].dump();
  EXPECT_TRUE(j["requests"].empty()) << j["requests"].dump();
  ASSERT_GE(j["drawn"].size(), min_charts) << c.out;
  EXPECT_EQ(j["charts"].get<size_t>(), j["drawn"].size());
  for (const auto& ch : j["drawn"]) {
    EXPECT_TRUE(ch["drawn"].get<bool>()) << ch.dump();
    EXPECT_TRUE(ch["canvas_painted"].get<bool>()) << ch.dump();
    EXPECT_GT(ch["width"].get<int>(), 0) << ch.dump();
  }
  EXPECT_GT(j["tables"].get<int>(), 0);
  EXPECT_TRUE(Exists(shot)) << shot;
  std::printf("%s: %zu plots drawn in %d ms; screenshot %s\n", name.c_str(), j["drawn"].size(),
              j["load_ms"].get<int>(), shot.c_str());
}

TEST(HtmlChromium, BlkDump) {
  // hist kind/device/register, timeline, rate
  CheckPage("inspect " + Data("blk-backend-delay.esdump"), "inspect-blk", 5);
}

TEST(HtmlChromium, MmioStormDump) {
  CheckPage("inspect " + Data("mmio-storm.esdump"), "inspect-mmio-storm", 5);
}

TEST(HtmlChromium, JointSchedCapture) {
  // + the split by kind, device and register
  CheckPage("inspect " + Data("joint-sched.esdump") + " --kernel " + Data("joint-sched.dat"),
            "joint-sched", 8);
}

TEST(HtmlChromium, KvmReportOfARealDat) {
  CheckPage("kvm report -i " + Data("joint-sched.dat") + " --device-map " +
                Data("joint-sched.esdump") + " --duration 1000",
            "kvm-report-joint-sched", 5);  // + histograms by device and register
}

}  // namespace
