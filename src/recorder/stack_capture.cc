// Stack captures of stuck vCPU threads: the signal handler (runs on the stuck thread: no
// allocation, no lock), the watchdog's side, and the parsers of /proc/self/task/TID/ files.
#define UNW_LOCAL_ONLY
#include "recorder/stack_capture.h"

#include <fcntl.h>
#include <libunwind.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/file_read.h"
#include "recorder/recorder_impl.h"
#include "recorder/symbolizer.h"

namespace exitscope::internal {

namespace {

// The one request in flight, process-wide: only the recorder that owns the signal sends it,
// from its watchdog thread, one capture at a time.
std::atomic<CaptureBuffer*> g_pending{nullptr};
std::mutex g_owner_mu;
const void* g_owner = nullptr;  // the StackSampler that installed the handler
struct sigaction g_old_action {};

void Unwind(CaptureBuffer* b, void* ucontext) {
  unw_cursor_t cursor;
  if (unw_init_local2(&cursor, static_cast<unw_context_t*>(ucontext), UNW_INIT_SIGNAL_FRAME) < 0)
    return;
  uint32_t n = 0, dropped = 0;
  do {
    unw_word_t ip = 0;
    if (unw_get_reg(&cursor, UNW_REG_IP, &ip) < 0 || ip == 0) break;
    if (n < b->cap) {
      b->ips[n++] = ip;
    } else if (++dropped >= 4096) {
      break;  // a loop in a corrupt stack: what was kept stays
    }
  } while (unw_step(&cursor) > 0);
  b->n = n;
  b->dropped = dropped;
}

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void OnStackSignal(int /*signo*/, siginfo_t* /*info*/, void* ucontext) {
  const int saved_errno = errno;
  const uint64_t t0 = MonotonicNs();
  CaptureBuffer* b = g_pending.load(std::memory_order_acquire);
  if (b != nullptr &&
      b->tid.load(std::memory_order_relaxed) == static_cast<int32_t>(syscall(SYS_gettid))) {
    uint32_t expect = CaptureBuffer::kPending;
    if (b->state.compare_exchange_strong(expect, CaptureBuffer::kRunning,
                                         std::memory_order_acq_rel)) {
      // This thread is the vCPU: nothing changes its exit while the handler runs.
      const VcpuSlot* slot = b->slot.load(std::memory_order_relaxed);
      const bool same = slot->exit_no.load(std::memory_order_relaxed) ==
                            b->expected_exit.load(std::memory_order_relaxed) &&
                        slot->cur[0].load(std::memory_order_relaxed) != 0;
      if (same) Unwind(b, ucontext);
      b->handler_ns = MonotonicNs() - t0;
      b->state.store(same ? CaptureBuffer::kDone : CaptureBuffer::kGone, std::memory_order_release);
    }
  }
  errno = saved_errno;
}

std::string TaskPath(int32_t tid, const char* file) {
  return "/proc/self/task/" + std::to_string(tid) + "/" + file;
}

// The whole of a small /proc file, or the errno of its failure.
bool ReadProc(const std::string& path, std::string* out, int* err) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return false;
  }
  out->clear();
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = errno;
      close(fd);
      return false;
    }
    if (n == 0 || out->size() > (1u << 20)) break;
    out->append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return true;
}

uint64_t Hex(std::string_view s, bool* ok) {
  if (s.starts_with("0x")) s.remove_prefix(2);
  uint64_t v = 0;
  *ok = !s.empty() && s.size() <= 16;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) *ok = false;
    v = v * 16 + static_cast<uint64_t>(d < 0 ? 0 : d);
  }
  return v;
}

}  // namespace

char ParseProcState(std::string_view stat) {
  const size_t paren = stat.rfind(')');
  if (paren == std::string_view::npos || paren + 2 >= stat.size()) return 0;
  const char c = stat[paren + 2];
  return c >= 'A' && c <= 'Z' ? c : 0;
}

std::vector<StackFrame> ParseKernelStack(std::string_view text, size_t max) {
  std::vector<StackFrame> out;
  while (!text.empty() && out.size() < max) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    // "[<0>] folio_wait_bit_common+0x13d/0x350"
    const size_t sp = line.find("] ");
    if (sp == std::string_view::npos) continue;
    line.remove_prefix(sp + 2);
    StackFrame f;
    f.module = "[kernel]";
    // "func+0x1/0x2 [module]" for a function of a kernel module
    if (const size_t bracket = line.find(" ["); bracket != std::string_view::npos) {
      std::string_view mod = line.substr(bracket + 2);
      if (!mod.empty() && mod.back() == ']') mod.remove_suffix(1);
      f.module = "[" + std::string(mod) + "]";
      line = line.substr(0, bracket);
    }
    const size_t plus = line.rfind('+');
    const size_t slash = line.rfind('/');
    if (plus != std::string_view::npos && slash != std::string_view::npos && slash > plus) {
      bool ok = false;
      f.offset = Hex(line.substr(plus + 1, slash - plus - 1), &ok);
      if (!ok) f.offset = 0;
      line = line.substr(0, plus);
    }
    if (line.empty()) continue;
    f.function = std::string(line);
    out.push_back(std::move(f));
  }
  return out;
}

std::optional<uint64_t> ParseSyscallPc(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  const size_t sp = text.rfind(' ');
  if (sp == std::string_view::npos) return std::nullopt;  // "running"
  bool ok = false;
  const uint64_t pc = Hex(text.substr(sp + 1), &ok);
  if (!ok || pc == 0) return std::nullopt;
  return pc;
}

StackSampler::StackSampler(const StackOptions& options, uint32_t num_vcpus)
    : options_(options),
      enabled_(options.enabled),
      buffers_(new CaptureBuffer[num_vcpus]),
      ips_(new uint64_t[static_cast<size_t>(num_vcpus) * options.max_frames]),
      symbolizer_(std::make_unique<Symbolizer>()) {
  for (uint32_t v = 0; v < num_vcpus; ++v) {
    buffers_[v].cap = options.max_frames;
    buffers_[v].ips = ips_.get() + static_cast<size_t>(v) * options.max_frames;
  }
}

StackSampler::~StackSampler() {
  RemoveSignal();
}

Status StackSampler::InstallSignal(int signo) {
  if (signo < SIGRTMIN || signo > SIGRTMAX) {
    return Fail(ErrorCode::kInvalidArgument,
                "stack signal " + std::to_string(signo) + " is not a real-time signal (" +
                    std::to_string(SIGRTMIN) + ".." + std::to_string(SIGRTMAX) + ")");
  }
  std::lock_guard<std::mutex> lock(g_owner_mu);
  if (g_owner != nullptr && g_owner != this) {
    return Fail(ErrorCode::kAlreadyExists,
                "another recorder in this process owns the stack signal");
  }
  if (g_owner == this && signo == signo_) return {};
  if (g_owner == this) {
    sigaction(signo_, &g_old_action, nullptr);
    g_owner = nullptr;
  }
  // Warm libunwind up on this thread (its first use may allocate), never first in a handler.
  unw_context_t ctx;
  unw_cursor_t cursor;
  if (unw_getcontext(&ctx) == 0 && unw_init_local(&cursor, &ctx) == 0) unw_step(&cursor);
  struct sigaction sa {};
  sa.sa_sigaction = OnStackSignal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(signo, &sa, &g_old_action) != 0) {
    return Fail(ErrorCode::kIo, std::string("sigaction: ") + std::strerror(errno));
  }
  g_owner = this;
  signo_ = signo;
  return {};
}

void StackSampler::RemoveSignal() {
  std::lock_guard<std::mutex> lock(g_owner_mu);
  if (g_owner != this) return;
  // A signal that timed out may still be pending on its thread (state D): restoring the default
  // action (terminate) would kill the process when it arrives. The handler stays, harmless
  // (with no request it returns), and no longer belongs to this recorder.
  if (timeouts_.load(std::memory_order_relaxed) == 0) sigaction(signo_, &g_old_action, nullptr);
  g_owner = nullptr;
  signo_ = 0;
}

StackCounters StackSampler::counters() const noexcept {
  StackCounters c;
  c.captures = captures_.load(std::memory_order_relaxed);
  c.signal_timeouts = timeouts_.load(std::memory_order_relaxed);
  c.exit_changed = exit_changed_.load(std::memory_order_relaxed);
  c.frames_dropped = frames_dropped_.load(std::memory_order_relaxed);
  c.captures_skipped = skipped_.load(std::memory_order_relaxed);
  return c;
}

bool StackSampler::SignalUser(CaptureBuffer* b, int32_t tid, const VcpuSlot& slot, uint64_t exit_no,
                              ThreadStack* out) {
  b->tid.store(tid, std::memory_order_relaxed);
  b->slot.store(&slot, std::memory_order_relaxed);
  b->expected_exit.store(exit_no, std::memory_order_relaxed);
  b->n = 0;
  b->dropped = 0;
  b->state.store(CaptureBuffer::kPending, std::memory_order_release);
  g_pending.store(b, std::memory_order_release);
  bool sent = syscall(SYS_tgkill, getpid(), tid, signo_) == 0;
  const int send_errno = errno;
  // The handler runs within microseconds on an idle host, milliseconds under load.
  constexpr auto kWait = std::chrono::milliseconds(100);
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  auto pause = std::chrono::microseconds(20);
  uint32_t st = b->state.load(std::memory_order_acquire);
  while (sent && (st == CaptureBuffer::kPending || st == CaptureBuffer::kRunning)) {
    if (st == CaptureBuffer::kPending && std::chrono::steady_clock::now() >= deadline) {
      uint32_t expect = CaptureBuffer::kPending;
      if (b->state.compare_exchange_strong(expect, CaptureBuffer::kWithdrawn,
                                           std::memory_order_acq_rel)) {
        st = CaptureBuffer::kWithdrawn;
        break;
      }
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
    st = b->state.load(std::memory_order_acquire);
  }
  g_pending.store(nullptr, std::memory_order_release);
  if (!sent) {
    b->state.store(CaptureBuffer::kIdle, std::memory_order_relaxed);
    out->note = std::string("user stack unavailable: tgkill: ") + std::strerror(send_errno);
    return false;
  }
  b->state.store(CaptureBuffer::kIdle, std::memory_order_relaxed);
  if (st == CaptureBuffer::kWithdrawn) {
    timeouts_.fetch_add(1, std::memory_order_relaxed);
    out->note = "user stack unavailable: the thread did not run the stack signal within " +
                std::to_string(kWait.count()) + " ms";
    return false;
  }
  if (st == CaptureBuffer::kGone) {
    exit_changed_.fetch_add(1, std::memory_order_relaxed);
    out->note = "user stack unavailable: the exit ended before the thread unwound";
    return false;
  }
  out->user = symbolizer_->Resolve(std::span<const uint64_t>(b->ips, b->n), true);
  out->user_dropped = b->dropped;
  frames_dropped_.fetch_add(b->dropped, std::memory_order_relaxed);
  return true;
}

ThreadStack StackSampler::Capture(uint32_t vcpu, const VcpuSlot& slot, int32_t tid,
                                  uint64_t exit_no, uint32_t capture) {
  ThreadStack s;
  s.tid = tid;
  s.capture = capture;
  if (tid <= 0) {
    s.note = "no thread id for this vCPU (Recorder::SetThreadId)";
    return s;
  }
  std::string text;
  int err = 0;
  if (ReadProc(TaskPath(tid, "stat"), &text, &err)) s.state = ParseProcState(text);
  std::vector<std::string> notes;
  if (ReadProc(TaskPath(tid, "stack"), &text, &err)) {
    s.kernel = ParseKernelStack(text, 64);
  } else {
    // Said once, in the first capture that lacks it (no privilege does not come and go).
    if (!kernel_note_logged_) {
      kernel_note_logged_ = true;
      notes.push_back("kernel stack not readable (" + TaskPath(tid, "stack") + ": " +
                      std::strerror(err) +
                      (err == EACCES || err == EPERM ? "; needs root); not said again" : ")"));
    }
  }
  const bool can_signal = signo_ != 0;
  if (s.state == 'D' || !can_signal) {
    // Uninterruptible sleep runs no handler until the I/O ends: the return address only.
    if (ReadProc(TaskPath(tid, "syscall"), &text, &err)) {
      if (std::optional<uint64_t> pc = ParseSyscallPc(text)) {
        const uint64_t ip = *pc;
        s.user = symbolizer_->Resolve(std::span<const uint64_t>(&ip, 1), false);
      }
    }
    notes.push_back(s.state == 'D'
                        ? "user stack unavailable: the thread is in uninterruptible sleep (D); "
                          "the return address of its system call only"
                        : "user stack unavailable: no stack signal installed "
                          "(Recorder::InstallStackSignal)");
  } else {
    SignalUser(&buffers_[vcpu], tid, slot, exit_no, &s);
  }
  for (const std::string& n : notes) {
    if (!s.note.empty()) s.note += "; ";
    s.note += n;
  }
  captures_.fetch_add(1, std::memory_order_relaxed);
  return s;
}

}  // namespace exitscope::internal

namespace exitscope {

void Recorder::TakeThreadId(uint32_t vcpu) noexcept {
  int32_t none = 0;
  slots_[vcpu].tid.compare_exchange_strong(none, static_cast<int32_t>(syscall(SYS_gettid)),
                                           std::memory_order_relaxed);
}

Status Recorder::SetThreadId(uint32_t vcpu, int32_t tid) {
  if (vcpu >= num_vcpus_) {
    return Fail(ErrorCode::kInvalidArgument, "vCPU " + std::to_string(vcpu) +
                                                 " is out of range (the recorder has " +
                                                 std::to_string(num_vcpus_) + ")");
  }
  if (tid <= 0) {
    return Fail(ErrorCode::kInvalidArgument, "thread id " + std::to_string(tid) + " is not > 0");
  }
  slots_[vcpu].tid.store(tid, std::memory_order_relaxed);
  return {};
}

int32_t Recorder::thread_id(uint32_t vcpu) const noexcept {
  return vcpu < num_vcpus_ ? slots_[vcpu].tid.load(std::memory_order_relaxed) : 0;
}

Status Recorder::InstallStackSignal(int signo) {
  return impl_->stacks.InstallSignal(signo);
}
void Recorder::RemoveStackSignal() {
  impl_->stacks.RemoveSignal();
}
void Recorder::SetStackCapture(bool on) noexcept {
  impl_->stacks.set_enabled(on);
}
StackCounters Recorder::stack_counters() const noexcept {
  return impl_->stacks.counters();
}

}  // namespace exitscope
