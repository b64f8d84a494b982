// Stack captures of stuck "vCPU" threads, driven on plain threads (no KVM needed): a thread
// begins an exit and then blocks in a read, on a lock another thread holds, spins, or sits in
// uninterruptible sleep; the watchdog must capture what it is doing. Names are asserted, never
// times.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "exitscope/recorder.h"
#include "recorder/stack_capture.h"
#include "recorder/symbolizer.h"

namespace exitscope {
namespace {

using namespace std::chrono_literals;

// ThreadSanitizer defers an asynchronous signal to its own safe points (a blocked read() never
// reaches one; a spin on an instrumented atomic may), so under TSan the handler runs late or in
// time: the capture then takes the timeout path (withdrawn, counted, said) or unwinds, and the
// TSan suite checks that either happens without a race.
#if defined(__SANITIZE_THREAD__)
constexpr bool kInThreadUnwind = false;
#else
constexpr bool kInThreadUnwind = true;
#endif

// Under TSan: frames, or the capture says why not and counts the timeout.
void ExpectTimedOut(const ThreadStack& s, const Recorder& rec) {
  if (!s.user.empty()) return;
  EXPECT_NE(s.note.find("did not run the stack signal"), std::string::npos) << s.note;
  EXPECT_GE(rec.stack_counters().signal_timeouts, 1u);
}

// The functions a stuck thread is in: not inlined, so they are frames of their own.
[[gnu::noinline]] ssize_t BlockedInRead(int fd) {
  char c = 0;
  ssize_t n;
  do {
    n = read(fd, &c, 1);
  } while (n < 0 && errno == EINTR);
  asm volatile("" ::: "memory");
  return n;
}

[[gnu::noinline]] void WaitForDeviceLock(std::mutex* mu) {
  mu->lock();
  asm volatile("" ::: "memory");
  mu->unlock();
}

[[gnu::noinline]] void SpinUntil(const std::atomic<bool>* stop) {
  while (!stop->load(std::memory_order_relaxed)) asm volatile("" ::: "memory");
}

[[gnu::noinline]] int SleepInChild(void*) {
  timespec ts{0, 600'000'000};
  syscall(SYS_nanosleep, &ts, nullptr);
  return 0;
}

// Waits in vfork-style clone until the child exits: the kernel shows the parent in state D
// (a killable uninterruptible wait) for that time.
[[gnu::noinline]] void WaitForVforkChild() {
  static char stack[64 * 1024] __attribute__((aligned(16)));
  const pid_t pid =
      clone(SleepInChild, stack + sizeof stack, CLONE_VFORK | CLONE_VM | SIGCHLD, nullptr);
  if (pid > 0) waitpid(pid, nullptr, 0);
}

struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<FindingRecord> findings;
  std::vector<std::string> log;

  bool WaitFor(FindingType type, size_t count, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] {
      size_t n = 0;
      for (const FindingRecord& f : findings) n += f.type == type;
      return n >= count;
    });
  }
  std::vector<FindingRecord> Of(FindingType type) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<FindingRecord> out;
    for (const FindingRecord& f : findings) {
      if (f.type == type) out.push_back(f);
    }
    return out;
  }
};

std::unique_ptr<Recorder> Make(Collected* c, uint32_t captures = 1, bool signal = true,
                               uint32_t max_frames = 48) {
  RecorderOptions o;
  o.num_vcpus = 1;
  o.slow_exit.threshold_ns = 60'000'000'000ull;
  o.watchdog = {.stuck_exit_ns = 40'000'000, .io_age_ns = 0, .poll_ns = 2'000'000};
  o.stacks.captures_per_stall = captures;
  o.stacks.max_frames = max_frames;
  auto r = Recorder::Create(o);
  EXPECT_TRUE(r.has_value());
  if (!r) return nullptr;
  (*r)->SetFindingHook([c](const FindingRecord& f) {
    std::lock_guard<std::mutex> lock(c->mu);
    c->findings.push_back(f);
    c->cv.notify_all();
  });
  (*r)->SetLogSink([c](std::string_view l) {
    std::lock_guard<std::mutex> lock(c->mu);
    c->log.emplace_back(l);
  });
  if (signal) {
    EXPECT_TRUE((*r)->InstallStackSignal(SIGRTMIN + 1).has_value());
  }
  return std::move(*r);
}

bool HasFunction(const std::vector<StackFrame>& frames, std::string_view name) {
  for (const StackFrame& f : frames) {
    if (f.function.find(name) != std::string::npos) return true;
  }
  return false;
}

std::string Dump(const ThreadStack& s) {
  std::ostringstream o;
  o << "tid " << s.tid << " state " << (s.state ? s.state : '?') << " note '" << s.note << "'\n";
  for (const StackFrame& f : s.kernel) o << "  k " << FormatFrame(f) << "\n";
  for (const StackFrame& f : s.user) o << "  u " << FormatFrame(f) << "\n";
  return o.str();
}

bool KernelStackReadable() {
  std::ifstream f("/proc/self/stack");
  std::string line;
  return f.good() && static_cast<bool>(std::getline(f, line));
}

// A "vCPU" thread of `rec` begins an MMIO exit and blocks in read() on a pipe until the
// watchdog has reported it stuck; returns the stuck finding.
FindingRecord StuckInRead(Recorder* rec, Collected* c) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  std::thread vcpu([&] {
    rec->BeginExit(0, ExitKind::kMmio, 0x1000, 4, AccessDir::kWrite, 1);
    BlockedInRead(fds[0]);
    rec->EndExit(0);
  });
  const bool stuck = c->WaitFor(FindingType::kStuckExitBegin, 1, 20s);
  EXPECT_EQ(write(fds[1], "x", 1), 1);
  vcpu.join();
  close(fds[0]);
  close(fds[1]);
  EXPECT_TRUE(stuck);
  return stuck ? c->Of(FindingType::kStuckExitBegin).at(0) : FindingRecord{};
}

// The same with a thread that spins in the exit (an HLT) instead of blocking.
FindingRecord StuckSpinning(Recorder* rec, Collected* c) {
  std::atomic<bool> stop{false};
  std::thread vcpu([&] {
    rec->BeginExit(0, ExitKind::kHlt);
    SpinUntil(&stop);
    rec->EndExit(0);
  });
  const bool stuck = c->WaitFor(FindingType::kStuckExitBegin, 1, 20s);
  stop = true;
  vcpu.join();
  EXPECT_TRUE(stuck);
  return stuck ? c->Of(FindingType::kStuckExitBegin).at(0) : FindingRecord{};
}

TEST(StackCapture, ThreadBlockedInReadShowsTheReadAndItsCaller) {
  Collected c;
  auto rec = Make(&c);
  ASSERT_NE(rec, nullptr);
  const FindingRecord f = StuckInRead(rec.get(), &c);
  const ThreadStack& s = f.stack;
  EXPECT_EQ(s.tid, rec->thread_id(0));
  EXPECT_EQ(s.capture, 1u);
  EXPECT_EQ(s.state, 'S') << Dump(s);
  if (kInThreadUnwind) {
    EXPECT_TRUE(HasFunction(s.user, "BlockedInRead")) << Dump(s);
    EXPECT_TRUE(HasFunction(s.user, "read")) << Dump(s);
    // The caller chain goes on past the test function (the thread's lambda, then libstdc++).
    EXPECT_GE(s.user.size(), 3u) << Dump(s);
  } else {
    ExpectTimedOut(s, *rec);
  }
  if (KernelStackReadable()) {
    EXPECT_TRUE(HasFunction(s.kernel, "pipe_read")) << Dump(s);
  } else {
    EXPECT_NE(s.note.find("kernel stack not readable"), std::string::npos) << s.note;
  }
  // The log: the finding's line, then the thread's header and its frames, indented.
  std::lock_guard<std::mutex> lock(c.mu);
  bool header = false, frame = false;
  for (const std::string& l : c.log) {
    header = header || l.starts_with("    thread " + std::to_string(s.tid) + " state S");
    frame = frame || (l.starts_with("      u ") && l.find("BlockedInRead") != std::string::npos) ||
            (l.starts_with("      k ") && !kInThreadUnwind);
  }
  EXPECT_TRUE(header && frame);
  EXPECT_EQ(rec->stack_counters().captures, 1u);
}

TEST(StackCapture, ThreadWaitingForALockAnotherThreadHolds) {
  Collected c;
  auto rec = Make(&c);
  ASSERT_NE(rec, nullptr);
  std::mutex device_lock;
  device_lock.lock();  // held by this thread, as a backend thread would
  std::thread vcpu([&] {
    rec->BeginExit(0, ExitKind::kPio, 0x3f8, 1, AccessDir::kWrite, 1);
    WaitForDeviceLock(&device_lock);
    rec->EndExit(0);
  });
  ASSERT_TRUE(c.WaitFor(FindingType::kStuckExitBegin, 1, 20s));
  device_lock.unlock();
  vcpu.join();
  const ThreadStack s = c.Of(FindingType::kStuckExitBegin).at(0).stack;
  if (kInThreadUnwind) {
    EXPECT_TRUE(HasFunction(s.user, "WaitForDeviceLock")) << Dump(s);
    EXPECT_TRUE(HasFunction(s.user, "pthread_mutex_lock") || HasFunction(s.user, "lll_lock") ||
                HasFunction(s.user, "futex"))
        << Dump(s);
  } else {
    ExpectTimedOut(s, *rec);
  }
  if (KernelStackReadable()) {
    EXPECT_TRUE(HasFunction(s.kernel, "futex")) << Dump(s);
  }
}

TEST(StackCapture, SpinningThreadIsCapturedWhereItSpins) {
  Collected c;
  auto rec = Make(&c);
  ASSERT_NE(rec, nullptr);
  const ThreadStack s = StuckSpinning(rec.get(), &c).stack;
  EXPECT_TRUE(s.state == 'R' || s.state == 'S') << Dump(s);  // R, or just preempted
  if (!kInThreadUnwind) return ExpectTimedOut(s, *rec);
  ASSERT_GE(s.user.size(), 2u) << Dump(s);
  // The interrupted instruction is inside the spin loop itself or, unoptimized (make asan's
  // Debug build), in the atomic load it calls, which calls std::__is_constant_evaluated():
  // SpinUntil is the innermost frame that is not the standard library's.
  size_t at = 0;
  while (at < s.user.size() && s.user[at].function.starts_with("std::")) ++at;
  ASSERT_LT(at, s.user.size()) << Dump(s);
  EXPECT_LE(at, 2u) << Dump(s);
  EXPECT_NE(s.user[at].function.find("SpinUntil"), std::string::npos) << Dump(s);
}

TEST(StackCapture, RepeatedCapturesWhileStillStuck) {
  Collected c;
  auto rec = Make(&c, 3);
  ASSERT_NE(rec, nullptr);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::thread vcpu([&] {
    rec->BeginExit(0, ExitKind::kMmio, 0x2000, 4, AccessDir::kRead);
    BlockedInRead(fds[0]);
    rec->EndExit(0);
  });
  // Captures at 1x, 4x and 16x the 40 ms threshold.
  const bool later = c.WaitFor(FindingType::kStuckExitStack, 2, 30s);
  ASSERT_EQ(write(fds[1], "x", 1), 1);
  vcpu.join();
  close(fds[0]);
  close(fds[1]);
  ASSERT_TRUE(later);
  const std::vector<FindingRecord> more = c.Of(FindingType::kStuckExitStack);
  ASSERT_EQ(more.size(), 2u);  // bounded by captures_per_stall
  EXPECT_EQ(more[0].stack.capture, 2u);
  EXPECT_EQ(more[1].stack.capture, 3u);
  EXPECT_GE(more[1].duration_ns, 16 * 40'000'000ull);
  EXPECT_NE(more[1].text.find("still stuck in"), std::string::npos) << more[1].text;
  EXPECT_NE(more[1].text.find("(stack capture 3 of 3)"), std::string::npos) << more[1].text;
  if (kInThreadUnwind) {
    EXPECT_TRUE(HasFunction(more[1].stack.user, "BlockedInRead")) << Dump(more[1].stack);
  }
  EXPECT_EQ(rec->stack_counters().captures, 3u);
  ASSERT_TRUE(c.WaitFor(FindingType::kStuckExitEnd, 1, 20s));
}

TEST(StackCapture, UninterruptibleSleepGivesStateAndKernelStackWithoutSignalling) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "TSan: a clone(CLONE_VM) child runs instrumented code in the parent's memory, "
                  "which corrupts TSan's thread bookkeeping (the test runs in every other build)";
#endif
  Collected c;
  auto rec = Make(&c);
  ASSERT_NE(rec, nullptr);
  std::thread vcpu([&] {
    rec->BeginExit(0, ExitKind::kMmio, 0x3000, 4, AccessDir::kWrite, 1);
    WaitForVforkChild();
    rec->EndExit(0);
  });
  ASSERT_TRUE(c.WaitFor(FindingType::kStuckExitBegin, 1, 20s));
  vcpu.join();
  const ThreadStack s = c.Of(FindingType::kStuckExitBegin).at(0).stack;
  ASSERT_EQ(s.state, 'D') << Dump(s);
  EXPECT_NE(s.note.find("uninterruptible sleep (D)"), std::string::npos) << s.note;
  EXPECT_EQ(rec->stack_counters().signal_timeouts, 0u);  // it was not signalled
  if (KernelStackReadable()) {
    EXPECT_TRUE(HasFunction(s.kernel, "clone")) << Dump(s);
  }
  // The return address of its system call: inside the clone wrapper of libc.
  ASSERT_EQ(s.user.size(), 1u) << Dump(s);
  EXPECT_NE(s.user[0].module.find("libc"), std::string::npos) << Dump(s);
}

TEST(StackCapture, WithoutTheSignalOnlyStateAndKernelStack) {
  Collected c;
  auto rec = Make(&c, 1, /*signal=*/false);
  ASSERT_NE(rec, nullptr);
  const ThreadStack s = StuckInRead(rec.get(), &c).stack;
  EXPECT_EQ(s.state, 'S');
  EXPECT_NE(s.note.find("no stack signal installed"), std::string::npos) << s.note;
  EXPECT_FALSE(HasFunction(s.user, "BlockedInRead")) << Dump(s);
}

TEST(StackCapture, SwitchedOffCapturesNothingAndCounts) {
  Collected c;
  auto rec = Make(&c);
  ASSERT_NE(rec, nullptr);
  rec->SetStackCapture(false);
  EXPECT_TRUE(StuckSpinning(rec.get(), &c).stack.empty());
  EXPECT_EQ(rec->stack_counters().captures, 0u);
  EXPECT_EQ(rec->stack_counters().captures_skipped, 1u);
}

TEST(StackCapture, FramesBeyondTheLimitAreCounted) {
  Collected c;
  auto made = Make(&c, 1, true, /*max_frames=*/2);
  ASSERT_NE(made, nullptr);
  Recorder& rec = *made;
  const ThreadStack s = StuckSpinning(&rec, &c).stack;
  if (!kInThreadUnwind) return ExpectTimedOut(s, rec);
  EXPECT_EQ(s.user.size(), 2u) << Dump(s);
  EXPECT_GE(s.user_dropped, 1u);
  EXPECT_EQ(rec.stack_counters().frames_dropped, s.user_dropped);
}

TEST(StackCapture, OptionsAndSignalAreChecked) {
  RecorderOptions o;
  o.stacks.max_frames = 0;
  auto r = Recorder::Create(o);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("stacks.max_frames 0 is out of range"), std::string::npos);
  o.stacks.max_frames = 48;
  o.stacks.captures_per_stall = 9;
  EXPECT_FALSE(Recorder::Create(o).has_value());
  o.stacks.captures_per_stall = 3;
  o.start_watchdog = false;
  auto a = Recorder::Create(o);
  auto b = Recorder::Create(o);
  ASSERT_TRUE(a && b);
  EXPECT_EQ((*a)->InstallStackSignal(SIGUSR1).error().code, ErrorCode::kInvalidArgument);
  ASSERT_TRUE((*a)->InstallStackSignal(SIGRTMIN + 1).has_value());
  EXPECT_EQ((*b)->InstallStackSignal(SIGRTMIN + 1).error().code, ErrorCode::kAlreadyExists);
  (*a)->RemoveStackSignal();
  EXPECT_TRUE((*b)->InstallStackSignal(SIGRTMIN + 1).has_value());
  EXPECT_EQ((*b)->SetThreadId(1, 5).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ((*b)->SetThreadId(0, 0).error().code, ErrorCode::kInvalidArgument);
  ASSERT_TRUE((*b)->SetThreadId(0, 4242).has_value());
  EXPECT_EQ((*b)->thread_id(0), 4242);
  (*b)->BeginExit(0, ExitKind::kHlt);  // the first exit keeps the id given
  (*b)->EndExit(0);
  EXPECT_EQ((*b)->thread_id(0), 4242);
  EXPECT_EQ((*b)->Snapshot().vcpus[0].tid, 4242);
}

TEST(StackCapture, FirstExitTakesTheThreadId) {
  RecorderOptions o;
  o.start_watchdog = false;
  auto r = Recorder::Create(o);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ((*r)->thread_id(0), 0);
  int32_t tid = 0;
  std::thread t([&] {
    tid = static_cast<int32_t>(syscall(SYS_gettid));
    (*r)->BeginExit(0, ExitKind::kHlt);
    (*r)->EndExit(0);
  });
  t.join();
  EXPECT_EQ((*r)->thread_id(0), tid);
  EXPECT_EQ((*r)->thread_id(7), 0);
}

// ---- /proc text as captured on a real host (testdata/stacks/README.md) -------------------

std::string ReadTestdata(const std::string& name) {
  std::ifstream f(std::string(EXITSCOPE_TESTDATA_DIR) + "/stacks/" + name);
  EXPECT_TRUE(f.good()) << name;
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(ProcText, StateDThreadFromARealHost) {
  EXPECT_EQ(internal::ParseProcState(ReadTestdata("vfork-wait.stat")), 'D');
  const std::vector<StackFrame> k =
      internal::ParseKernelStack(ReadTestdata("vfork-wait.stack"), 64);
  ASSERT_FALSE(k.empty());
  EXPECT_TRUE(HasFunction(k, "kernel_clone"));
  for (const StackFrame& f : k) EXPECT_EQ(f.module, "[kernel]");
  EXPECT_NE(k[0].offset, 0u);
  const auto pc = internal::ParseSyscallPc(ReadTestdata("vfork-wait.syscall"));
  ASSERT_TRUE(pc.has_value());
  EXPECT_GT(*pc, 0x1000u);
}

TEST(ProcText, PipeReadFromARealHost) {
  EXPECT_EQ(internal::ParseProcState(ReadTestdata("pipe-read.stat")), 'S');
  const std::vector<StackFrame> k = internal::ParseKernelStack(ReadTestdata("pipe-read.stack"), 64);
  EXPECT_TRUE(HasFunction(k, "pipe_read"));
  EXPECT_TRUE(internal::ParseSyscallPc(ReadTestdata("pipe-read.syscall")).has_value());
  EXPECT_EQ(internal::ParseKernelStack(ReadTestdata("pipe-read.stack"), 2).size(), 2u);
}

TEST(ProcText, OddTextIsHandled) {
  EXPECT_EQ(internal::ParseProcState(""), 0);
  EXPECT_EQ(internal::ParseProcState("12 (a) b) R 1"), 'R');  // comm with ')' in it
  EXPECT_EQ(internal::ParseProcState("12 (x"), 0);
  EXPECT_FALSE(internal::ParseSyscallPc("running\n").has_value());
  EXPECT_EQ(internal::ParseSyscallPc("-1 0x7ffd0000 0x7f0000001234\n"), 0x7f0000001234u);
  EXPECT_FALSE(internal::ParseSyscallPc("0 0x1 zz\n").has_value());
  const auto k = internal::ParseKernelStack("garbage\n[<0>] \n[<0>] f+0x1/0x2 [kvm]\n", 64);
  ASSERT_EQ(k.size(), 1u);
  EXPECT_EQ(k[0].function, "f");
  EXPECT_EQ(k[0].offset, 1u);
  EXPECT_EQ(k[0].module, "[kvm]");
}

TEST(Demangle, CxxAndBothRustManglings) {
  EXPECT_EQ(internal::Demangle("_ZN9exitscope3vmm8BlockDev5WriteEv"),
            "exitscope::vmm::BlockDev::Write()");
  EXPECT_EQ(internal::Demangle("_ZN4core3fmt5write17h1234567890abcdefE"), "core::fmt::write");
  EXPECT_EQ(internal::Demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
  EXPECT_EQ(internal::Demangle("anon_pipe_read"), "anon_pipe_read");
  EXPECT_EQ(internal::Demangle("_Zbroken"), "_Zbroken");
}

TEST(FormatFrame, ResolvedUnresolvedAndKernel) {
  StackFrame f{.ip = 0x401234,
               .offset = 0x1f,
               .function = "backend_read",
               .module = "/usr/bin/exitscope",
               .file = "src/vmm/blk.cc",
               .line = 120};
  EXPECT_EQ(FormatFrame(f), "backend_read+0x1f (src/vmm/blk.cc:120) [exitscope]");
  StackFrame u;
  u.ip = 0x7f00;
  u.module = "/lib/libc.so.6";
  EXPECT_EQ(FormatFrame(u), "0x7f00 [libc.so.6]");
  StackFrame k;
  k.offset = 0x5c;
  k.function = "anon_pipe_read";
  k.module = "[kernel]";
  EXPECT_EQ(FormatFrame(k), "anon_pipe_read+0x5c [kernel]");
}

}  // namespace
}  // namespace exitscope
