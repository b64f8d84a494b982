// `exitscope run` as a user runs it: usage errors, --list-guests, and the one-line answer
// without /dev/kvm.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace {

struct Out {
  int status = -1;
  std::string text;
};

Out RunCmd(const std::string& args) {
  const std::string cmd = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope run " + args + " 2>&1";
  Out o;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) o.text.append(buf, n);
  const int st = pclose(p);
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

int Lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(RunCli, ListGuestsNamesTheShippedGuests) {
  Out o = RunCmd("--list-guests");
  EXPECT_EQ(o.status, 0) << o.text;
  for (const char* g : {"hello", "blk", "mmio-storm", "idle"})
    EXPECT_NE(o.text.find(g), std::string::npos) << g;
  EXPECT_EQ(o.text.find("(image not built)"), std::string::npos) << o.text;
}

TEST(RunCli, UsageErrorsExit2WithOneLineNamingTheFlag) {
  struct Case {
    const char* args;
    const char* needle;
  } cases[] = {
      {"--inject bogus", "--inject bogus"},
      {"--inject delay:nvme0:abc", "not a number"},
      {"--vcpus 0", "--vcpus"},
      {"--vcpus 17", "--vcpus"},
      {"--format xml", "--format xml"},
      {"--guest no-such-guest", "no-such-guest"},
      {"--slow 0", "--slow"},
      {"--no-such-flag", "no-such-flag"},
  };
  for (const Case& c : cases) {
    Out o = RunCmd(c.args);
    EXPECT_EQ(o.status, 2) << c.args << ": " << o.text;
    EXPECT_EQ(Lines(o.text), 1) << c.args << ": " << o.text;
    EXPECT_NE(o.text.find(c.needle), std::string::npos) << c.args << ": " << o.text;
    EXPECT_EQ(o.text.rfind("exitscope run: ", 0), 0u) << o.text;
  }
}

TEST(RunCli, WithoutKvmSaysSoInOneLineAndExits1) {
  const int fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd >= 0) {
    close(fd);
    GTEST_SKIP() << "/dev/kvm is available here; this test covers hosts without it";
  }
  Out o = RunCmd("--guest blk");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_EQ(Lines(o.text), 1) << o.text;
  EXPECT_EQ(o.text.rfind("exitscope run: /dev/kvm not available (", 0), 0u) << o.text;
  EXPECT_NE(o.text.find("): this command needs KVM"), std::string::npos) << o.text;
}

}  // namespace
