// Tests of TracefsSession against the real tracefs of this machine: every setting a session
// changes comes back byte for byte (normal end, signal path, error path), and a missing or
// forbidden tracefs gets a one-line explanation. Each test that sets something up in tracefs
// (a scratch instance) removes it again, also when an assertion fails.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "sources/tracefs_session.h"

namespace exitscope::sources {
namespace {

std::string Slurp(const std::string& path) {
  auto r = ReadTracefsFile(path);
  return r ? *r : "<unreadable: " + r.error().message + ">";
}

std::vector<std::string> Instances(const std::string& tracefs) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir((tracefs + "/instances").c_str())) {
    while (dirent* e = ::readdir(d)) out.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool DirExists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The real tracefs, or a reason to skip.
std::string RealTracefs(std::string* why) {
  ::unsetenv("EXITSCOPE_TRACEFS");
  auto dir = FindTracefs();
  if (!dir) {
    *why = dir.error().message;
    return "";
  }
  return *dir;
}

#define REQUIRE_TRACEFS(dir)                         \
  std::string skip_reason;                           \
  const std::string dir = RealTracefs(&skip_reason); \
  if (dir.empty()) GTEST_SKIP() << "tracefs not usable: " << skip_reason

// A scratch instance with non-default settings, removed when the test ends.
class ScratchInstance {
 public:
  explicit ScratchInstance(const std::string& tracefs)
      : name_("es-test-" + std::to_string(::getpid())), dir_(tracefs + "/instances/" + name_) {
    ::rmdir(dir_.c_str());
    ok_ = ::mkdir(dir_.c_str(), 0700) == 0;
    if (!ok_) return;
    // Values a session will change, set to something other than what it sets.
    (void)WriteTracefsFile(dir_ + "/trace_clock", "global");
    (void)WriteTracefsFile(dir_ + "/buffer_size_kb", "1024");
    (void)WriteTracefsFile(dir_ + "/per_cpu/cpu0/buffer_size_kb", "512");
    (void)WriteTracefsFile(dir_ + "/set_event_pid", "1");
    (void)WriteTracefsFile(dir_ + "/events/kvm/kvm_pio/filter", "port == 0x3f8");
    (void)WriteTracefsFile(dir_ + "/events/kvm/kvm_msr/enable", "1");
    (void)WriteTracefsFile(dir_ + "/tracing_on", "0");
  }
  ~ScratchInstance() {
    if (!ok_) return;
    (void)WriteTracefsFile(dir_ + "/tracing_on", "0");
    ::rmdir(dir_.c_str());
  }
  bool ok() const { return ok_; }
  const std::string& name() const { return name_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string name_, dir_;
  bool ok_ = false;
};

TracefsOptions ChangingEverything(const std::string& instance) {
  TracefsOptions o;
  o.instance = instance;
  o.events = {"kvm:*", "syscalls:sys_enter_getppid"};
  o.clocks = {"x86-tsc", "mono"};
  o.pid = ::getpid();
  o.follow_children = true;
  o.buffer_kb = 2048;
  return o;
}

void ExpectChanged(const TracefsSession& s, const std::string& dir) {
  EXPECT_EQ(SelectedClock(Slurp(dir + "/trace_clock")), s.clock());
  EXPECT_TRUE(s.clock() == "x86-tsc" || s.clock() == "mono") << s.clock();
  // The kernel rounds to whole pages of data (4080 of 4096 bytes): 2048 -> 2051.
  const long kb = std::atol(Slurp(dir + "/buffer_size_kb").c_str());
  EXPECT_GE(kb, 2048);
  EXPECT_LT(kb, 2048 + 64);
  EXPECT_NE(Slurp(dir + "/set_event_pid").find(std::to_string(::getpid())), std::string::npos);
  EXPECT_EQ(Slurp(dir + "/options/event-fork"), "1\n");
  EXPECT_EQ(Slurp(dir + "/events/kvm/kvm_userspace_exit/enable"), "1\n");
  EXPECT_EQ(Slurp(dir + "/events/syscalls/sys_enter_getppid/enable"), "1\n");
  EXPECT_EQ(Slurp(dir + "/tracing_on"), "0\n");  // until Start()
}

TEST(TracefsSessionTest, PrivateInstanceLeavesTopLevelAndInstancesUntouched) {
  REQUIRE_TRACEFS(tracefs);
  const std::vector<std::string> systems = {"kvm", "syscalls"};
  auto before = TracefsSettings::Capture(tracefs, systems);
  ASSERT_TRUE(before) << before.error().message;
  const std::vector<std::string> instances_before = Instances(tracefs);

  TracefsOptions o = ChangingEverything("");
  std::string buffer_dir;
  {
    auto s = TracefsSession::Open(o);
    ASSERT_TRUE(s) << s.error().message;
    buffer_dir = (*s)->buffer_dir();
    EXPECT_TRUE((*s)->owns_instance());
    EXPECT_EQ(buffer_dir, tracefs + "/instances/exitscope-" + std::to_string(::getpid()));
    EXPECT_TRUE(DirExists(buffer_dir));
    ExpectChanged(**s, buffer_dir);
    ASSERT_TRUE((*s)->Start());
    EXPECT_EQ(Slurp(buffer_dir + "/tracing_on"), "1\n");
    ASSERT_TRUE((*s)->Close());
  }
  EXPECT_FALSE(DirExists(buffer_dir));
  auto after = TracefsSettings::Capture(tracefs, systems);
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_EQ(before->Diff(*after), std::vector<std::string>{});
  EXPECT_EQ(before->files(), after->files());
  EXPECT_EQ(Instances(tracefs), instances_before);
}

TEST(TracefsSessionTest, ExistingInstanceRestoredByteForByteOnClose) {
  REQUIRE_TRACEFS(tracefs);
  ScratchInstance inst(tracefs);
  ASSERT_TRUE(inst.ok()) << "cannot create " << inst.dir();
  const std::vector<std::string> systems = {"kvm", "syscalls"};
  auto before = TracefsSettings::Capture(inst.dir(), systems);
  ASSERT_TRUE(before) << before.error().message;
  ASSERT_EQ(SelectedClock(Slurp(inst.dir() + "/trace_clock")), "global");
  ASSERT_EQ(Slurp(inst.dir() + "/events/kvm/kvm_pio/filter"), "port == 0x3f8\n");

  {
    auto s = TracefsSession::Open(ChangingEverything(inst.name()));
    ASSERT_TRUE(s) << s.error().message;
    EXPECT_FALSE((*s)->owns_instance());
    ExpectChanged(**s, inst.dir());
    ASSERT_TRUE((*s)->Start());
    ::syscall(SYS_getppid);
    Status closed = (*s)->Close();
    ASSERT_TRUE(closed) << closed.error().message;
    // Close is idempotent; the destructor's second restore changes nothing.
    ASSERT_TRUE((*s)->Close());
  }
  auto after = TracefsSettings::Capture(inst.dir(), systems);
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_EQ(before->Diff(*after), std::vector<std::string>{});
  EXPECT_EQ(before->files(), after->files());
  // The scratch instance had per-CPU sizes that differ ("X" in the total): restored one by one.
  EXPECT_EQ(Slurp(inst.dir() + "/buffer_size_kb"), "X\n");
  EXPECT_EQ(Slurp(inst.dir() + "/set_event_pid"), "1\n");
}

TEST(TracefsSessionTest, TopLevelSessionRestoresItsSettings) {
  REQUIRE_TRACEFS(tracefs);
  // The top level is shared with every other tracer on the machine: change only what a
  // top-level session must (events of one quiet system, clock, pid filter), not the buffer
  // size (an unexpanded top-level buffer cannot be shrunk back to "unexpanded").
  const std::vector<std::string> systems = {"kvm"};
  auto before = TracefsSettings::Capture(tracefs, systems);
  ASSERT_TRUE(before) << before.error().message;
  {
    TracefsOptions o;
    o.top_level = true;
    o.events = {"kvm:kvm_userspace_exit", "kvm:kvm_pio"};
    o.pid = ::getpid();
    auto s = TracefsSession::Open(o);
    ASSERT_TRUE(s) << s.error().message;
    EXPECT_EQ((*s)->buffer_dir(), tracefs);
    EXPECT_EQ(Slurp(tracefs + "/events/kvm/kvm_pio/enable"), "1\n");
    // No Close(): the destructor restores.
  }
  auto after = TracefsSettings::Capture(tracefs, systems);
  ASSERT_TRUE(after) << after.error().message;
  // buffer_size_kb may go from "7 (expanded: 1408)" to "1408": enabling any event expands
  // the top-level buffer, which the kernel cannot undo. Everything else is identical.
  std::vector<std::string> diff;
  for (const std::string& d : before->Diff(*after))
    if (d.find("buffer_size_kb") == std::string::npos) diff.push_back(d);
  EXPECT_EQ(diff, std::vector<std::string>{});
  // The size is the one the kernel expands to, never the "7" placeholder of an unused buffer.
  auto find = [](const TracefsSettings& s, const std::string& rel) {
    for (const auto& [r, c] : s.files())
      if (r == rel) return c;
    return std::string();
  };
  const std::string was = find(*before, "buffer_size_kb"), now = find(*after, "buffer_size_kb");
  const size_t at = was.find("(expanded: ");
  if (at == std::string::npos) {
    EXPECT_EQ(now, was);
  } else {
    EXPECT_TRUE(now == was || now == was.substr(at + 11, was.find(')') - at - 11) + "\n")
        << "'" << was << "' -> '" << now << "'";
  }
}

TEST(TracefsSessionTest, SigintPathRestoresFromTheMainLoop) {
  REQUIRE_TRACEFS(tracefs);
  ScratchInstance inst(tracefs);
  ASSERT_TRUE(inst.ok());
  const std::vector<std::string> systems = {"kvm", "syscalls"};
  auto before = TracefsSettings::Capture(inst.dir(), systems);
  ASSERT_TRUE(before);

  struct sigaction prev;
  ::sigaction(SIGINT, nullptr, &prev);
  {
    StopSignalScope scope;
    StopSignalScope::Reset();
    auto s = TracefsSession::Open(ChangingEverything(inst.name()));
    ASSERT_TRUE(s) << s.error().message;
    ASSERT_TRUE((*s)->Start());
    int loops = 0;
    while (!StopSignalScope::StopRequested() && loops < 1000) {
      if (loops++ == 3) ::raise(SIGINT);  // as Ctrl-C would
      ::usleep(1000);
    }
    EXPECT_TRUE(StopSignalScope::StopRequested());
    EXPECT_EQ(StopSignalScope::LastSignal(), SIGINT);
    EXPECT_EQ(Slurp(inst.dir() + "/tracing_on"), "1\n");
    // The main loop ends the session: destructor restores.
  }
  struct sigaction now;
  ::sigaction(SIGINT, nullptr, &now);
  EXPECT_EQ(now.sa_handler, prev.sa_handler);  // the scope put the old handler back
  StopSignalScope::Reset();
  auto after = TracefsSettings::Capture(inst.dir(), systems);
  ASSERT_TRUE(after);
  EXPECT_EQ(before->Diff(*after), std::vector<std::string>{});
}

TEST(TracefsSessionTest, RealSigtermToAnotherProcessRestores) {
  REQUIRE_TRACEFS(tracefs);
  ScratchInstance inst(tracefs);
  ASSERT_TRUE(inst.ok());
  const std::vector<std::string> systems = {"kvm", "syscalls"};
  auto before = TracefsSettings::Capture(inst.dir(), systems);
  ASSERT_TRUE(before);

  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    StopSignalScope scope;
    auto s = TracefsSession::Open(ChangingEverything(inst.name()));
    if (!s || !(*s)->Start()) ::_exit(3);
    const char c = 'r';
    if (::write(ready[1], &c, 1) != 1) ::_exit(4);
    for (int i = 0; i < 10000 && !StopSignalScope::StopRequested(); ++i) ::usleep(1000);
    if (!StopSignalScope::StopRequested()) ::_exit(5);
    const bool ok = static_cast<bool>((*s)->Close());
    ::_exit(ok ? 0 : 6);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  EXPECT_EQ(Slurp(inst.dir() + "/tracing_on"), "1\n");  // the child is tracing
  ASSERT_EQ(::kill(child, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto after = TracefsSettings::Capture(inst.dir(), systems);
  ASSERT_TRUE(after);
  EXPECT_EQ(before->Diff(*after), std::vector<std::string>{});
}

TEST(TracefsSessionTest, FailureHalfwayRestoresWhatWasChanged) {
  REQUIRE_TRACEFS(tracefs);
  ScratchInstance inst(tracefs);
  ASSERT_TRUE(inst.ok());
  const std::vector<std::string> systems = {"kvm", "syscalls"};
  auto before = TracefsSettings::Capture(inst.dir(), systems);
  ASSERT_TRUE(before);
  TracefsOptions o = ChangingEverything(inst.name());
  o.pid = 0x3ffffff0;  // no such process: found after clock and buffer size were changed
  auto s = TracefsSession::Open(o);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.error().message.find("no such process"), std::string::npos) << s.error().message;
  auto after = TracefsSettings::Capture(inst.dir(), systems);
  ASSERT_TRUE(after);
  EXPECT_EQ(before->Diff(*after), std::vector<std::string>{});
}

TEST(TracefsSessionTest, UnknownEventRefusedBeforeAnyChange) {
  REQUIRE_TRACEFS(tracefs);
  TracefsOptions o;
  o.events = {"kvm:no_such_event"};
  auto s = TracefsSession::Open(o);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.error().message.find('\n'), std::string::npos);
  EXPECT_NE(s.error().message.find("kvm/no_such_event"), std::string::npos) << s.error().message;
  EXPECT_FALSE(DirExists(tracefs + "/instances/exitscope-" + std::to_string(::getpid())));
  o.events = {"nosuchsystem:*"};
  EXPECT_FALSE(TracefsSession::Open(o));
  o.events = {"../x:y"};
  EXPECT_FALSE(TracefsSession::Open(o));
}

TEST(TracefsSessionTest, StaleInstanceOfADeadProcessIsRemoved) {
  REQUIRE_TRACEFS(tracefs);
  // A pid that does not exist: fork a child that exits at once, and reap it.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  const std::string stale = tracefs + "/instances/exitscope-" + std::to_string(dead);
  ASSERT_EQ(::mkdir(stale.c_str(), 0700), 0);
  TracefsOptions o;
  o.events = {"kvm:kvm_pio"};
  auto s = TracefsSession::Open(o);
  ASSERT_TRUE(s) << s.error().message;
  const bool stale_gone = !DirExists(stale);
  if (!stale_gone) ::rmdir(stale.c_str());
  EXPECT_TRUE(stale_gone);
  EXPECT_TRUE((*s)->Close());
}

// --- tracefs missing / not permitted -------------------------------------------------------

TEST(TracefsSessionTest, MissingTracefsExplainsWhatToDo) {
  ::setenv("EXITSCOPE_TRACEFS", "/nonexistent/tracing", 1);
  auto dir = FindTracefs();
  auto s = TracefsSession::Open(TracefsOptions{});
  ::unsetenv("EXITSCOPE_TRACEFS");
  ASSERT_FALSE(dir);
  EXPECT_EQ(dir.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(dir.error().message,
            "tracefs not found at /nonexistent/tracing (from EXITSCOPE_TRACEFS): point "
            "EXITSCOPE_TRACEFS at a mounted tracefs, or mount one with `mount -t tracefs nodev "
            "/nonexistent/tracing` as root");
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().message, dir.error().message);

  TracefsOptions o;
  o.tracefs_dir = "/nonexistent/tracing";
  auto s2 = TracefsSession::Open(o);
  ASSERT_FALSE(s2);
  EXPECT_EQ(s2.error().message.find('\n'), std::string::npos);
  EXPECT_NE(s2.error().message.find("mount -t tracefs nodev"), std::string::npos);
}

TEST(TracefsSessionTest, DirectoryThatIsNotTracefsIsRefused) {
  char tmpl[] = "/tmp/exitscope-notracefs-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  auto dir = FindTracefs(tmpl);
  ::rmdir(tmpl);
  ASSERT_FALSE(dir);
  EXPECT_EQ(dir.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(dir.error().message.find('\n'), std::string::npos);
  EXPECT_NE(dir.error().message.find("is not a tracefs mount"), std::string::npos)
      << dir.error().message;
}

TEST(TracefsSessionTest, NotPermittedExplainsWhatToDo) {
  REQUIRE_TRACEFS(tracefs);
  if (::getuid() != 0) GTEST_SKIP() << "needs root to drop to an unprivileged uid";
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(out[0]);
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(9);
    TracefsOptions o;
    o.tracefs_dir = tracefs;
    auto s = TracefsSession::Open(o);
    std::string msg = s ? std::string("opened") : s.error().message;
    const char code = s ? 0 : static_cast<char>(s.error().code);
    if (::write(out[1], &code, 1) != 1) ::_exit(8);
    if (::write(out[1], msg.data(), msg.size()) < 0) ::_exit(8);
    ::_exit(0);
  }
  ::close(out[1]);
  std::string got;
  char buf[512];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(static_cast<ErrorCode>(got[0]), ErrorCode::kPermission);
  const std::string msg = got.substr(1);
  EXPECT_EQ(msg, "tracefs at " + tracefs +
                     " is not writable for uid 65534 (Permission denied): run as root (e.g. "
                     "`sudo exitscope kvm ...`)");
}

}  // namespace
}  // namespace exitscope::sources
