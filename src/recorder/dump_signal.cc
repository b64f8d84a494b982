// Dump on signal: a signal handler that only writes to an eventfd, and a thread that writes a
// dump into the configured directory each time it fires.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "exitscope/recorder.h"
#include "recorder/describe.h"
#include "recorder/recorder_impl.h"

namespace exitscope {

// ---- Dump on signal ----------------------------------------------------------------------
//
// The handler writes to one process-wide eventfd that is never closed (so a late signal can
// never write into a recycled descriptor). The owning recorder's thread polls that eventfd
// and its own stop eventfd.

namespace {

std::atomic<int> g_dump_efd{-1};

void DumpSignalHandler(int) {
  const int saved = errno;
  const int fd = g_dump_efd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof one);
    (void)n;
  }
  errno = saved;
}

std::mutex g_sig_mu;
const Recorder* g_sig_owner = nullptr;  // under g_sig_mu

int GlobalDumpEventFd() {
  static const int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return fd;
}
}  // namespace

class DumpSignalThread {
 public:
  static void Run(Recorder* rec, int stop_fd) {
    Recorder::Impl& im = *rec->impl_;
    const int efd = GlobalDumpEventFd();
    for (;;) {
      pollfd fds[2] = {{efd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
      const int n = poll(fds, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        rec->Log("exitscope: dump signal thread: poll failed: " +
                 std::string(std::strerror(errno)));
        return;
      }
      if (im.sig_stop.load() || (fds[1].revents & POLLIN) != 0) return;
      uint64_t count = 0;
      if (read(efd, &count, sizeof count) != static_cast<ssize_t>(sizeof count)) continue;
      WriteOne(rec);
    }
  }

 private:
  static void WriteOne(Recorder* rec) {
    Recorder::Impl& im = *rec->impl_;
    std::string dir;
    DumpOptions opts;
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(im.sig_mu);
      dir = im.sig_dir;
      opts = im.sig_options;
    }
    {
      std::lock_guard<std::mutex> lock(im.mu);
      seq = ++im.signal_dumps;
    }
    std::string comm = internal::ReadProcessInfo().comm;
    for (char& c : comm) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-';
      if (!ok) c = '_';
    }
    if (comm.empty()) comm = "vmm";
    const time_t t = time(nullptr);
    struct tm tmv;
    gmtime_r(&t, &tmv);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%S", &tmv);
    const std::string path = dir + "/exitscope-" + comm + "-" + std::to_string(getpid()) + "-" +
                             stamp + "-" + std::to_string(seq) + ".esdump";
    Status s = rec->WriteDump(path, opts);
    if (s) {
      {
        std::lock_guard<std::mutex> lock(im.mu);
        im.last_signal_dump = path;
      }
      rec->Log("exitscope: wrote dump " + path);
    } else {
      rec->Log("exitscope: dump on signal failed: " + s.error().message);
    }
  }
};

Status Recorder::InstallDumpSignal(int signo, std::string directory, DumpOptions options) {
  if (signo <= 0 || signo >= NSIG || signo == SIGKILL || signo == SIGSTOP) {
    return Fail(ErrorCode::kInvalidArgument,
                "signal " + std::to_string(signo) + " cannot be used to request dumps");
  }
  // Synchronous fault signals: the kernel raises them on the faulting instruction, and a
  // handler that returns re-executes it (a loop, or a lost crash). Never ours to take.
  if (signo == SIGSEGV || signo == SIGBUS || signo == SIGFPE || signo == SIGILL ||
      signo == SIGTRAP || signo == SIGSYS || signo == SIGABRT) {
    return Fail(ErrorCode::kInvalidArgument,
                "signal " + std::to_string(signo) + " (" + strsignal(signo) +
                    ") is a synchronous fault signal; use e.g. SIGUSR1 to request dumps");
  }
  struct stat st;
  if (stat(directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Fail(ErrorCode::kInvalidArgument, directory + ": not a directory");
  }
  if (GlobalDumpEventFd() < 0) {
    return Fail(ErrorCode::kIo, std::string("eventfd: ") + std::strerror(errno));
  }
  RemoveDumpSignal();
  std::lock_guard<std::mutex> glock(g_sig_mu);
  if (g_sig_owner != nullptr && g_sig_owner != this) {
    return Fail(ErrorCode::kAlreadyExists,
                "another recorder in this process already owns the dump signal");
  }
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.sig_mu);
  const int stop_fd = eventfd(0, EFD_CLOEXEC);
  if (stop_fd < 0) return Fail(ErrorCode::kIo, std::string("eventfd: ") + std::strerror(errno));
  im.sig_efd = stop_fd;
  im.sig_dir = std::move(directory);
  im.sig_options = options;
  im.sig_stop.store(false);
  try {
    im.sig_thread = std::thread(&DumpSignalThread::Run, this, stop_fd);
  } catch (const std::system_error& e) {
    close(stop_fd);
    im.sig_efd = -1;
    return Fail(ErrorCode::kInternal, std::string("cannot start the dump thread: ") + e.what());
  }
  g_dump_efd.store(GlobalDumpEventFd());
  struct sigaction sa {};
  sa.sa_handler = &DumpSignalHandler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(signo, &sa, &im.sig_old) != 0) {
    const int err = errno;
    im.sig_stop.store(true);
    const uint64_t one = 1;
    (void)!write(stop_fd, &one, sizeof one);
    im.sig_thread.join();
    close(stop_fd);
    im.sig_efd = -1;
    return Fail(ErrorCode::kIo, "sigaction(" + std::to_string(signo) + "): " + std::strerror(err));
  }
  im.sig_signo = signo;
  g_sig_owner = this;
  return {};
}

void Recorder::RemoveDumpSignal() {
  std::lock_guard<std::mutex> glock(g_sig_mu);
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.sig_mu);
  if (im.sig_efd < 0) return;
  sigaction(im.sig_signo, &im.sig_old, nullptr);
  if (g_sig_owner == this) g_sig_owner = nullptr;
  im.sig_stop.store(true);
  const uint64_t one = 1;
  (void)!write(im.sig_efd, &one, sizeof one);
  if (im.sig_thread.joinable()) im.sig_thread.join();
  close(im.sig_efd);
  im.sig_efd = -1;
  im.sig_signo = 0;
}

std::string Recorder::last_signal_dump() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last_signal_dump;
}
}  // namespace exitscope
