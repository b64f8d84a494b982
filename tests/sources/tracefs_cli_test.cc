// End-to-end tests of `exitscope kvm record` and `exitscope kvm live` (build/exitscope) on
// this machine's tracefs: recording a command's own tracepoint hits, Ctrl-C, bad usage, a
// missing tracefs, tracefs left as found. The live-guest test needs /dev/kvm and skips
// without it: it records `exitscope run --guest hello` and checks that the kernel saw as many
// userspace exits as the VMM counted.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "sources/tracefs_session.h"
#include "support/run.h"
#include "support/tracefs.h"

namespace exitscope::sources {
namespace {

const std::string kBin = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope";

using test::Instances;
using test::Ran;
using test::ReadFile;

// Runs argv with stdout/stderr captured; `on_start` (if any) gets the pid while it runs.
Ran RunCmd(const std::vector<std::string>& argv, const std::function<void(pid_t)>& on_start = {}) {
  return test::Run(argv, on_start);
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = 0; (pos = text.find(needle, pos)) != std::string::npos; pos += needle.size())
    ++n;
  return n;
}

class TracefsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kBin.c_str(), X_OK) != 0) GTEST_SKIP() << kBin << " not built";
    ::unsetenv("EXITSCOPE_TRACEFS");
    auto dir = FindTracefs();
    if (!dir) GTEST_SKIP() << "tracefs not usable: " << dir.error().message;
    tracefs_ = *dir;
    auto s = TracefsSettings::Capture(tracefs_, {"kvm", "syscalls"});
    ASSERT_TRUE(s) << s.error().message;
    before_ = std::make_unique<TracefsSettings>(std::move(*s));
    instances_ = Instances(tracefs_);
    char tmpl[] = "/tmp/exitscope-cli-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override {
    if (!before_) return;
    auto after = TracefsSettings::Capture(tracefs_, {"kvm", "syscalls"});
    ASSERT_TRUE(after);
    EXPECT_EQ(before_->Diff(*after), std::vector<std::string>{}) << "tracefs not restored";
    EXPECT_EQ(Instances(tracefs_), instances_) << "an instance was left behind";
    if (!tmp_.empty()) {
      if (DIR* d = ::opendir(tmp_.c_str())) {
        while (dirent* e = ::readdir(d))
          if (e->d_name[0] != '.') ::unlink((tmp_ + "/" + e->d_name).c_str());
        ::closedir(d);
      }
      ::rmdir(tmp_.c_str());
    }
  }
  std::string tracefs_, tmp_;
  std::unique_ptr<TracefsSettings> before_;
  std::vector<std::string> instances_;
};

TEST_F(TracefsCliTest, RecordTracesOnlyTheCommandAndTraceCmdReadsTheFile) {
  const std::string out = tmp_ + "/cmd.dat";
  // dash and bash call getppid at startup (for $PPID): the command and the shell it forks
  // both hit sys_enter_getppid, the second only if fork-following works.
  Ran r = RunCmd({kBin, "kvm", "record", "-o", out, "-e", "syscalls:sys_enter_getppid", "-e",
                  "kvm:*", "--", "/bin/sh", "-c", "echo $PPID >/dev/null; /bin/sh -c true"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + out), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stopped: '/bin/sh' exited with status 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sys_enter_getppid"), std::string::npos) << r.out;
  int status = 0;
  FILE* p = ::popen(("trace-cmd report " + out + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string report;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) report.append(buf, n);
  status = ::pclose(p);
  if (report.find("not found") != std::string::npos && status != 0)
    GTEST_SKIP() << "trace-cmd not installed";
  EXPECT_EQ(status, 0) << report;
  // Both shells (the command and its child, followed through fork) asked for their parent.
  EXPECT_GE(Count(report, "sys_enter_getppid"), 2u) << report;
}

TEST_F(TracefsCliTest, CtrlCStopsTheRecordingAndRestoresTracefs) {
  const std::string out = tmp_ + "/sigint.dat";
  const std::string tracefs = tracefs_;
  Ran r = RunCmd({kBin, "kvm", "record", "-o", out, "--duration", "60"}, [&](pid_t pid) {
    // Wait until its private instance exists (tracing is on), then Ctrl-C.
    const std::string inst = tracefs + "/instances/exitscope-" + std::to_string(pid);
    struct stat st;
    for (int i = 0; i < 500 && ::stat(inst.c_str(), &st) != 0; ++i) ::usleep(10'000);
    ::usleep(200'000);
    ::kill(pid, SIGINT);
  });
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("stopped: signal 2"), std::string::npos) << r.out;
  struct stat st;
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_size % 4096, 0);  // header and pages, page aligned
  EXPECT_GT(st.st_size, 0);
}

TEST_F(TracefsCliTest, LiveRunsRefreshesAndRestores) {
  Ran r = RunCmd({kBin, "kvm", "live", "-d", "0.3", "--stop-after", "1", "--format", "json"});
  ASSERT_EQ(r.status, 0) << r.err;
  // One JSON document per line: at least one refresh within the second, plus the final one.
  const size_t docs = Count(r.out, "\n");
  EXPECT_GE(docs, 2u) << r.out;
  EXPECT_NE(r.out.find("\"schema\""), std::string::npos) << r.out.substr(0, 500);
  Ran t = RunCmd({kBin, "kvm", "live", "-d", "0.2", "--stop-after", "0.5", "--percentiles"});
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("exitscope kvm live: final"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("Total Samples:"), std::string::npos) << t.out;
}

TEST_F(TracefsCliTest, BadUsageAndMissingTracefsGetOneLine) {
  Ran r = RunCmd({kBin, "kvm", "record"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(Count(r.err, "\n"), 1u) << r.err;
  EXPECT_NE(r.err.find("--output"), std::string::npos) << r.err;

  r = RunCmd({kBin, "kvm", "record", "-o", tmp_ + "/x.dat", "--", "/nonexistent/cmd"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "exitscope kvm record: cannot run '/nonexistent/cmd': No such file or "
            "directory\n");
  EXPECT_NE(::access((tmp_ + "/x.dat").c_str(), F_OK), 0);  // no partial output left

  r = RunCmd({kBin, "kvm", "record", "-o", tmp_ + "/x.dat", "-e", "kvm:nope", "--duration", "1"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(Count(r.err, "\n"), 1u) << r.err;

  r = RunCmd({kBin, "kvm", "record", "-o", tmp_ + "/x.dat", "--tracefs", "/nonexistent/tracing",
              "--duration", "1"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "exitscope kvm record: tracefs not found at /nonexistent/tracing: point "
            "EXITSCOPE_TRACEFS at a mounted tracefs, or mount one with `mount -t tracefs "
            "nodev /nonexistent/tracing` as root\n");

  r = RunCmd({kBin, "kvm", "live", "--tracefs", "/nonexistent/tracing"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(Count(r.err, "\n"), 1u) << r.err;
  EXPECT_NE(r.err.find("mount -t tracefs"), std::string::npos) << r.err;

  r = RunCmd({kBin, "kvm", "live", "--format", "xml"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(Count(r.err, "\n"), 1u) << r.err;
}

// --- a real guest (needs /dev/kvm) ----------------------------------------------------------

TEST_F(TracefsCliTest, RecordedUserspaceExitsMatchTheVmmsOwnCount) {
  const int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    GTEST_SKIP() << "/dev/kvm not available: " << std::strerror(errno)
                 << " (this test records a real guest)";
  }
  ::close(fd);
  const std::string out = tmp_ + "/guest.dat";
  Ran r =
      RunCmd({kBin, "kvm", "record", "-o", out, "--", kBin, "run", "--guest", "hello", "--vcpus",
              "1", "--dump", tmp_ + "/hello.esdump", "--serial", tmp_ + "/serial.txt"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  // The VMM's own count: "exitscope run: guest hello on 1 vCPU: ... N userspace exits".
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"((\d+) userspace exits)"))) << r.err;
  const unsigned long vmm_exits = std::stoul(m[1]);
  ASSERT_GT(vmm_exits, 0u);
  // What the kernel saw: kvm_userspace_exit records in the file...
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(kvm_userspace_exit (\d+))"))) << r.out;
  EXPECT_EQ(std::stoul(m[1]), vmm_exits) << r.out << r.err;
  // ... and what `kvm report` makes of them: every exit the VMM counted is either paired
  // (re-entered: in Total Samples) or open at end of trace (the exit that ends the guest
  // never re-enters), never dropped.
  Ran rep = RunCmd({kBin, "kvm", "report", "-i", out, "--event", "userspace"});
  ASSERT_EQ(rep.status, 0) << rep.err;
  ASSERT_TRUE(std::regex_search(rep.out, m, std::regex(R"(Total Samples:(\d+))"))) << rep.out;
  const unsigned long paired = std::stoul(m[1]);
  unsigned long open = 0;
  if (std::regex_search(rep.out, m, std::regex(R"(Open at end of trace: (\d+) exits)"))) {
    open = std::stoul(m[1]);
  }
  EXPECT_EQ(paired + open, vmm_exits) << rep.out;
  EXPECT_LE(open, 1u) << "one vCPU: at most its last exit is open" << rep.out;
}

}  // namespace
}  // namespace exitscope::sources
