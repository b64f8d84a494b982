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
#include <optional>
#include <string>
#include <vector>

#include "base/clock_name.h"
#include "gtest/gtest.h"
#include "sources/tracefs_session.h"
#include "support/tracefs.h"

namespace exitscope::sources {
namespace {

std::string Slurp(const std::string& path) {
  auto r = ReadTracefsFile(path);
  return r ? *r : "<unreadable: " + r.error().message + ">";
}

using test::Instances;

bool DirExists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The real tracefs, or a reason to skip.

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
  EXPECT_EQ(base::SelectedClock(Slurp(dir + "/trace_clock")), s.clock());
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

// No buffer_size_kb of `after` (total or per CPU) is smaller than the size `before` traced
// with: for an unexpanded buffer the size it expands to, never its 7 KiB placeholder.
void ExpectNeverShrunk(const TracefsSettings& before, const TracefsSettings& after) {
  std::optional<uint64_t> promised;
  for (const auto& [rel, content] : before.files())
    if (rel == "buffer_size_kb")
      if (auto t = ParseBufferSizeKb(content)) promised = t->expanded_kb;
  for (const auto& [rel, content] : before.files()) {
    if (!rel.ends_with("buffer_size_kb")) continue;
    auto was = ParseBufferSizeKb(content);
    ASSERT_TRUE(was) << rel << ": " << was.error().message;
    if (was->mixed) continue;
    const uint64_t want = promised.value_or(was->kb);
    for (const auto& [rel2, content2] : after.files()) {
      if (rel2 != rel) continue;
      auto now = ParseBufferSizeKb(content2);
      ASSERT_TRUE(now) << rel2 << ": " << now.error().message;
      if (now->mixed || now->expanded_kb) continue;
      EXPECT_GE(now->kb, want) << rel << ": '" << content << "' -> '" << content2 << "'";
    }
  }
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
  ExpectNeverShrunk(*before, *after);
}

TEST(TracefsSessionTest, ExistingInstanceRestoredByteForByteOnClose) {
  REQUIRE_TRACEFS(tracefs);
  ScratchInstance inst(tracefs);
  ASSERT_TRUE(inst.ok()) << "cannot create " << inst.dir();
  const std::vector<std::string> systems = {"kvm", "syscalls"};
  auto before = TracefsSettings::Capture(inst.dir(), systems);
  ASSERT_TRUE(before) << before.error().message;
  ASSERT_EQ(base::SelectedClock(Slurp(inst.dir() + "/trace_clock")), "global");
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
  // Everything identical; buffer_size_kb may go from "7 (expanded: 1408)" to "1410" (enabling
  // any event expands the top-level buffer, which the kernel cannot undo), which Diff counts
  // as the same buffer.
  EXPECT_EQ(before->Diff(*after), std::vector<std::string>{});
  ExpectNeverShrunk(*before, *after);
}

// A buffer the kernel created at full size (an instance, or a top level already expanded)
// that a session resizes comes back byte for byte, total and every CPU.
TEST(TracefsSessionTest, FreshInstanceBufferSizeComesBackExactly) {
  REQUIRE_TRACEFS(tracefs);
  const std::string name = "es-test-fresh-" + std::to_string(::getpid());
  const std::string dir = tracefs + "/instances/" + name;
  ::rmdir(dir.c_str());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << dir;
  struct Remove {
    std::string d;
    ~Remove() { ::rmdir(d.c_str()); }
  } remove{dir};
  const std::string fresh = Slurp(dir + "/buffer_size_kb");
  auto size = ParseBufferSizeKb(fresh);
  ASSERT_TRUE(size) << size.error().message;
  // On Linux 6.18 an instance is allocated at full size at once: it never reads
  // "(expanded: ...)", so the unexpanded case exists only at the top level after boot (and is
  // tested on files below).
  EXPECT_FALSE(size->mixed);
  const std::vector<std::string> systems = {"kvm"};
  auto before = TracefsSettings::Capture(dir, systems);
  ASSERT_TRUE(before) << before.error().message;
  {
    TracefsOptions o;
    o.instance = name;
    o.events = {"kvm:kvm_pio"};
    o.buffer_kb = 2048;
    auto s = TracefsSession::Open(o);
    ASSERT_TRUE(s) << s.error().message;
    EXPECT_NE(Slurp(dir + "/buffer_size_kb"), fresh);
    ASSERT_TRUE((*s)->Close());
  }
  auto after = TracefsSettings::Capture(dir, systems);
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_EQ(before->files(), after->files());
  EXPECT_EQ(Slurp(dir + "/buffer_size_kb"), fresh);
}

// --- buffer_size_kb as the kernel prints it ------------------------------------------------

TEST(TracefsBufferSizeTest, ParsesTheThreeForms) {
  auto unexpanded = ParseBufferSizeKb("7 (expanded: 1408)\n");
  ASSERT_TRUE(unexpanded) << unexpanded.error().message;
  EXPECT_FALSE(unexpanded->mixed);
  EXPECT_EQ(unexpanded->kb, 7u);
  EXPECT_EQ(unexpanded->expanded_kb, 1408u);

  auto plain = ParseBufferSizeKb("1410\n");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->kb, 1410u);
  EXPECT_FALSE(plain->expanded_kb.has_value());

  auto mixed = ParseBufferSizeKb("X\n");
  ASSERT_TRUE(mixed);
  EXPECT_TRUE(mixed->mixed);

  for (const char* bad : {"", "\n", "abc\n", "7 (expanded: )\n", "7 (expanded: 1408\n",
                          "7 (expanded: x)\n", "-7\n", "(expanded: 1408)\n"}) {
    auto r = ParseBufferSizeKb(bad);
    EXPECT_FALSE(r) << "'" << bad << "'";
    if (!r) {
      EXPECT_EQ(r.error().code, ErrorCode::kCorrupt);
    }
  }
}

TEST(TracefsBufferSizeTest, UnexpandedEqualsItsExpandedSizeOnly) {
  // 4080 bytes of data per 4 KiB page: 1408 KiB is 354 pages, which read back as 1410.
  EXPECT_TRUE(SameBufferSize("7 (expanded: 1408)\n", "7 (expanded: 1408)\n", 4080));
  EXPECT_TRUE(SameBufferSize("7 (expanded: 1408)\n", "1410\n", 4080));
  EXPECT_TRUE(SameBufferSize("7 (expanded: 1408)\n", "1408\n", 4080));
  EXPECT_FALSE(SameBufferSize("7 (expanded: 1408)\n", "7\n", 4080));  // shrunk: the old bug
  EXPECT_FALSE(SameBufferSize("7 (expanded: 1408)\n", "2051\n", 4080));
  EXPECT_FALSE(SameBufferSize("1410\n", "7 (expanded: 1408)\n", 4080));
  EXPECT_FALSE(SameBufferSize("1410\n", "1408\n", 4080));  // two reads of one size are equal
  EXPECT_TRUE(SameBufferSize("X\n", "X\n", 4080));
  EXPECT_FALSE(SameBufferSize("X\n", "1410\n", 4080));
}

// A directory laid out like a tracefs buffer, with the files a session saves, holding what
// the kernel printed: what Restore writes is what lands in the files.
class FakeBuffer {
 public:
  FakeBuffer() {
    char tmpl[] = "/tmp/exitscope-fakebuf-XXXXXX";
    dir_ = ::mkdtemp(tmpl) ? tmpl : "";
    for (const char* d : {"/per_cpu", "/per_cpu/cpu0", "/per_cpu/cpu1", "/events", "/events/kvm",
                          "/events/kvm/kvm_pio"})
      ::mkdir((dir_ + d).c_str(), 0700);
  }
  ~FakeBuffer() {
    for (const char* f : {"/buffer_size_kb", "/per_cpu/cpu0/buffer_size_kb",
                          "/per_cpu/cpu1/buffer_size_kb", "/tracing_on", "/events/header_page",
                          "/events/kvm/kvm_pio/enable", "/events/kvm/kvm_pio/filter"})
      ::unlink((dir_ + f).c_str());
    for (const char* d : {"/events/kvm/kvm_pio", "/events/kvm", "/events", "/per_cpu/cpu1",
                          "/per_cpu/cpu0", "/per_cpu", ""})
      ::rmdir((dir_ + d).c_str());
  }
  void Set(const std::string& rel, const std::string& content) {
    std::ofstream(dir_ + "/" + rel, std::ios::trunc) << content;
  }
  std::string Get(const std::string& rel) const { return Slurp(dir_ + "/" + rel); }
  const std::string& dir() const { return dir_; }

  // The state of a host's top level after boot, as Linux 6.18 prints it.
  void SetUnexpanded() {
    Set("buffer_size_kb", "7 (expanded: 1408)\n");
    Set("per_cpu/cpu0/buffer_size_kb", "7\n");
    Set("per_cpu/cpu1/buffer_size_kb", "7\n");
    Set("tracing_on", "1\n");
    // The real header_page of this kernel (testdata/tracefs-pvm-6.18/).
    Set("events/header_page",
        "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
        "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
        "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
        "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n");
    Set("events/kvm/kvm_pio/enable", "0\n");
    Set("events/kvm/kvm_pio/filter", "none\n");
  }
  void SetAllSizes(const std::string& kb) {
    Set("buffer_size_kb", kb);
    Set("per_cpu/cpu0/buffer_size_kb", kb);
    Set("per_cpu/cpu1/buffer_size_kb", kb);
  }

 private:
  std::string dir_;
};

TEST(TracefsBufferSizeTest, UnexpandedBufferIsLeftAtItsExpandedSizeNeverShrunk) {
  FakeBuffer b;
  ASSERT_FALSE(b.dir().empty());
  b.SetUnexpanded();
  auto saved = TracefsSettings::Capture(b.dir(), {"kvm"});
  ASSERT_TRUE(saved) << saved.error().message;
  EXPECT_EQ(saved->page_data_bytes(), 4080u);

  // The session enabled an event: the kernel expanded every CPU to 1410 KiB.
  b.SetAllSizes("1410\n");
  b.Set("events/kvm/kvm_pio/enable", "1\n");
  b.Set("tracing_on", "0\n");
  auto st = saved->Restore();
  ASSERT_TRUE(st) << st.error().message;
  // Before the fix the per-CPU files got their placeholder "7" back: 7 KiB per CPU.
  EXPECT_EQ(b.Get("per_cpu/cpu0/buffer_size_kb"), "1410\n");
  EXPECT_EQ(b.Get("per_cpu/cpu1/buffer_size_kb"), "1410\n");
  EXPECT_EQ(b.Get("buffer_size_kb"), "1410\n");  // already the expanded size: not written
  EXPECT_EQ(b.Get("events/kvm/kvm_pio/enable"), "0");
  EXPECT_EQ(b.Get("tracing_on"), "1");
  // As the kernel would print what Restore wrote.
  b.Set("events/kvm/kvm_pio/enable", "0\n");
  b.Set("tracing_on", "1\n");
  auto after = TracefsSettings::Capture(b.dir(), {"kvm"});
  ASSERT_TRUE(after);
  EXPECT_EQ(saved->Diff(*after), std::vector<std::string>{});
}

TEST(TracefsBufferSizeTest, UnexpandedBufferResizedBySessionGetsItsExpandedSizeBack) {
  FakeBuffer b;
  ASSERT_FALSE(b.dir().empty());
  b.SetUnexpanded();
  auto saved = TracefsSettings::Capture(b.dir(), {"kvm"});
  ASSERT_TRUE(saved) << saved.error().message;
  // The session asked for 2048 KiB per CPU (--buffer-kb), or an earlier run shrank it to 7.
  for (const char* now : {"2051\n", "7\n"}) {
    SCOPED_TRACE(now);
    b.SetAllSizes(now);
    auto st = saved->Restore();
    ASSERT_TRUE(st) << st.error().message;
    // The total is written with the expanded size (the kernel resizes every CPU with it);
    // no per-CPU file is ever written the 7 KiB placeholder.
    EXPECT_EQ(b.Get("buffer_size_kb"), "1408");
    EXPECT_EQ(b.Get("per_cpu/cpu0/buffer_size_kb"), now);
    EXPECT_EQ(b.Get("per_cpu/cpu1/buffer_size_kb"), now);
  }
}

TEST(TracefsBufferSizeTest, ReadBackFormsAreWrittenInTheFormTheFileAccepts) {
  FakeBuffer b;
  ASSERT_FALSE(b.dir().empty());
  b.SetUnexpanded();
  b.SetAllSizes("1410\n");
  b.Set("per_cpu/cpu1/buffer_size_kb", "512\n");
  b.Set("buffer_size_kb", "X\n");
  b.Set("events/kvm/kvm_pio/enable", "1*\n");
  b.Set("events/kvm/kvm_pio/filter", "none\n");
  auto saved = TracefsSettings::Capture(b.dir(), {"kvm"});
  ASSERT_TRUE(saved) << saved.error().message;
  b.SetAllSizes("2051\n");
  b.Set("events/kvm/kvm_pio/enable", "0\n");
  b.Set("events/kvm/kvm_pio/filter", "port == 0x80\n");
  auto st = saved->Restore();
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(b.Get("buffer_size_kb"), "2051\n");  // "X" is never written
  EXPECT_EQ(b.Get("per_cpu/cpu0/buffer_size_kb"), "1410");
  EXPECT_EQ(b.Get("per_cpu/cpu1/buffer_size_kb"), "512");
  EXPECT_EQ(b.Get("events/kvm/kvm_pio/enable"), "1");  // soft-mode marker dropped
  EXPECT_EQ(b.Get("events/kvm/kvm_pio/filter"), "0");  // "none" is cleared with 0
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
