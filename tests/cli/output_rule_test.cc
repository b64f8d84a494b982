// Every command's -o follows the one output rule (base/output_file.h, docs/faults.md#output-files):
// a symlink or a device node is refused in one line and left as it was; a regular file is
// replaced whole; nothing but the run's own temporary file is ever removed.
#include <dirent.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "support/run.h"

namespace {

using exitscope::test::ReadFile;
using exitscope::test::RunExitscope;

std::string Data(const char* rel) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/" + rel;
}

// Each command that writes -o, as ARGS before " -o PATH".
std::vector<std::string> Commands() {
  return {
      "inspect " + Data("blk-backend-delay.esdump"),
      "inspect " + Data("blk-backend-delay.esdump") + " --format json",
      "kvm report -i " + Data("joint-blk.dat"),
      "kvm report -i " + Data("joint-blk.dat") + " --format csv",
      "kvm report -i " + Data("joint-blk.dat") + " --format json",
      "timeline " + Data("blk-backend-delay.esdump"),
      "timeline " + Data("joint-blk.esdump") + " " + Data("joint-blk.dat"),
  };
}

class OutputRule : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/es-output-rule-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    DIR* d = opendir(dir_.c_str());
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    closedir(d);
    return names;
  }
  std::string dir_;
};

TEST_F(OutputRule, ASymlinkIsRefusedAndNeitherItNorItsTargetChanges) {
  for (const std::string& cmd : Commands()) {
    const std::string target = dir_ + "/precious", link = dir_ + "/out";
    std::ofstream(target) << "precious";
    ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
    const auto o = RunExitscope(cmd + " -o " + link);
    EXPECT_EQ(o.status, 2) << cmd << "\n" << o.out;
    EXPECT_NE(o.out.find(link + ": exists and is a symlink"), std::string::npos) << cmd << "\n"
                                                                                 << o.out;
    struct stat st;
    ASSERT_EQ(lstat(link.c_str(), &st), 0);
    EXPECT_TRUE(S_ISLNK(st.st_mode)) << cmd;
    EXPECT_EQ(ReadFile(target), "precious") << cmd;
    EXPECT_EQ(Names().size(), 2u) << cmd;  // no temporary file left
    unlink(link.c_str());
    unlink(target.c_str());
  }
}

TEST_F(OutputRule, ADeviceNodeIsRefusedNotRemoved) {
  // A node of its own with /dev/full's numbers, so that a writer that removes what it replaces
  // (as one did: issue 28) cannot take the machine's /dev/full with it.
  const std::string full = dir_ + "/full";
  if (mknod(full.c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0) {
    GTEST_SKIP() << "cannot make a device node here (mknod: " << std::strerror(errno) << ")";
  }
  for (const std::string& cmd : Commands()) {
    const auto o = RunExitscope(cmd + " -o " + full);
    EXPECT_EQ(o.status, 2) << cmd << "\n" << o.out;
    EXPECT_NE(o.out.find(full + ": exists and is a character device"), std::string::npos)
        << cmd << "\n"
        << o.out;
    struct stat st;
    ASSERT_EQ(lstat(full.c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << cmd;
    EXPECT_EQ(Names(), std::vector<std::string>{"full"}) << cmd;
  }
}

TEST_F(OutputRule, ARegularFileIsReplacedWhole) {
  for (const std::string& cmd : Commands()) {
    const std::string out = dir_ + "/out";
    std::ofstream(out) << std::string(1 << 20, 'x');  // longer than any of these outputs
    const auto o = RunExitscope(cmd + " -o " + out, /*merge_stderr=*/false);
    ASSERT_EQ(o.status, 0) << cmd << "\n" << o.err;
    const std::string got = ReadFile(out);
    EXPECT_FALSE(got.empty()) << cmd;
    EXPECT_EQ(got.find('x' + std::string(64, 'x')), std::string::npos) << cmd;  // nothing old
    EXPECT_EQ(Names(), std::vector<std::string>{"out"}) << cmd;
    unlink(out.c_str());
  }
}

}  // namespace
