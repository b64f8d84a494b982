// `exitscope kvm report` end to end: the binary on the real capture, exit codes and one-line
// errors for bad input and bad usage. Skips (with the reason) when the binary is not built.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

const std::string kBin = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope";
const std::string kDat = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/pvm-user64-pio-mmio-hlt.dat";

struct CmdResult {
  int status = -1;
  std::string out;
};

CmdResult Exec(const std::string& args) {
  CmdResult r;
  FILE* p = popen((kBin + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class KvmCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kBin)) GTEST_SKIP() << "exitscope binary not built: " << kBin;
    if (!std::filesystem::exists(kDat)) GTEST_SKIP() << "capture not found: " << kDat;
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

}  // namespace
