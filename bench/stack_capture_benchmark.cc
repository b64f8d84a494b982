// What stack captures cost (docs/stacks.md, "Cost"), all in one run:
//   1. one capture of a thread blocked in read(), as the watchdog makes it: the first (libdw
//      reads the modules' DWARF) and then N more (symbols cached): the watchdog's time per
//      capture (the /proc reads, the signal's round trip, symbolizing), and the stuck thread's
//      time inside the signal handler (the unwind);
//   2. the recorder's per-exit hot path against two clock reads, and the same loop compiled
//      without frame pointers (bench/stack_capture_loop.cc, compiled twice), interleaved block
//      by block so that all three see the same machine. Medians over the blocks.
//
//   build/bench/stack_capture_benchmark [--captures N] [--blocks N]
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "exitscope/recorder.h"
#include "recorder/stack_capture.h"

void RecordLoopFramePointers(exitscope::Recorder& r, const uint64_t* addrs, size_t n);
void RecordLoopNoFramePointers(exitscope::Recorder& r, const uint64_t* addrs, size_t n);

namespace {

using exitscope::Clock;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}
double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

[[gnu::noinline]] void BlockedRead(int fd) {
  char c;
  while (read(fd, &c, 1) < 0 && errno == EINTR) {
  }
  asm volatile("" ::: "memory");
}

int Captures(int n) {
  exitscope::StackOptions opts;
  exitscope::internal::StackSampler sampler(opts, 1);
  if (auto st = sampler.InstallSignal(SIGRTMIN + 1); !st) {
    std::fprintf(stderr, "stack_capture_benchmark: %s\n", st.error().message.c_str());
    return 1;
  }
  exitscope::internal::VcpuSlot slot;
  slot.exit_no.store(1);
  slot.cur[0].store(1);  // "inside exit 1"
  int fds[2];
  if (pipe(fds) != 0) return 1;
  std::atomic<int32_t> tid{0};
  std::thread stuck([&] {
    tid = static_cast<int32_t>(syscall(SYS_gettid));
    BlockedRead(fds[0]);
  });
  while (tid.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it block
  std::vector<double> watchdog_us, handler_us;
  size_t frames = 0, kernel_frames = 0;
  double first_us = 0, first_handler_us = 0;
  for (int i = 0; i <= n; ++i) {
    const uint64_t t0 = Clock::MonotonicNs();
    exitscope::ThreadStack s = sampler.Capture(0, slot, tid.load(), 1, 1);
    const double us = static_cast<double>(Clock::MonotonicNs() - t0) / 1000.0;
    const double h = static_cast<double>(sampler.last_handler_ns(0)) / 1000.0;
    if (i == 0) {
      first_us = us;
      first_handler_us = h;
      frames = s.user.size();
      kernel_frames = s.kernel.size();
      if (s.user.empty()) std::fprintf(stderr, "no user frames: %s\n", s.note.c_str());
      continue;
    }
    watchdog_us.push_back(us);
    handler_us.push_back(h);
  }
  (void)!write(fds[1], "x", 1);
  stuck.join();
  close(fds[0]);
  close(fds[1]);
  const exitscope::StackCounters c = sampler.counters();
  std::printf("captures of a thread blocked in read(): %zu user + %zu kernel frames\n", frames,
              kernel_frames);
  std::printf("  first capture (libdw loads DWARF): watchdog %.0f us, stuck thread %.1f us\n",
              first_us, first_handler_us);
  std::printf("  next %d (symbols cached), median / p90:\n", n);
  std::printf("    on the watchdog        %8.1f / %8.1f us per capture\n", Median(watchdog_us),
              Quantile(watchdog_us, 0.9));
  std::printf("    on the stuck thread    %8.1f / %8.1f us per capture (in the handler)\n",
              Median(handler_us), Quantile(handler_us, 0.9));
  std::printf("  counters: captures %llu, timeouts %llu, exit changed %llu\n",
              static_cast<unsigned long long>(c.captures),
              static_cast<unsigned long long>(c.signal_timeouts),
              static_cast<unsigned long long>(c.exit_changed));
  return c.signal_timeouts == 0 ? 0 : 1;
}

int HotPath(int blocks) {
  exitscope::RecorderOptions o;
  o.start_watchdog = false;
  auto created = exitscope::Recorder::Create(o);
  if (!created) return 1;
  exitscope::Recorder& r = **created;
  const uint32_t dev = *r.address_space().AddDevice({.name = "nvme0", .kind = "nvme"});
  (void)r.address_space().AddRange(exitscope::IoSpace::kMmio, 0xfebf0000, 0x4000, dev,
                                   *exitscope::RegisterMap::Builtin("nvme"));
  std::vector<uint64_t> addrs(4096);
  for (size_t i = 0; i < addrs.size(); ++i) addrs[i] = 0xfebf0000 + (i * 8) % 0x4000;
  const Clock& clock = r.clock();
  constexpr size_t kBlock = 512;
  std::vector<double> fp, nofp, clocks, ratio_fp, ratio_nofp;
  RecordLoopFramePointers(r, addrs.data(), 4096);  // warm
  RecordLoopNoFramePointers(r, addrs.data(), 4096);
  for (int b = 0; b < blocks; ++b) {
    const uint64_t t0 = Clock::MonotonicNs();
    RecordLoopFramePointers(r, addrs.data(), kBlock);
    const uint64_t t1 = Clock::MonotonicNs();
    RecordLoopNoFramePointers(r, addrs.data(), kBlock);
    const uint64_t t2 = Clock::MonotonicNs();
    uint64_t sink = 0;
    for (size_t k = 0; k < 2 * kBlock; ++k) sink += clock.Now();
    const uint64_t t3 = Clock::MonotonicNs();
    asm volatile("" : : "r"(sink));
    const double e = static_cast<double>(t1 - t0) / kBlock;
    const double n = static_cast<double>(t2 - t1) / kBlock;
    const double c = static_cast<double>(t3 - t2) / kBlock;
    fp.push_back(e);
    nofp.push_back(n);
    clocks.push_back(c);
    ratio_fp.push_back(c > 0 ? e / c : 0);
    ratio_nofp.push_back(n > 0 ? e / n : 0);
  }
  std::printf("per-exit hot path (BeginExit + EndExit), %d interleaved blocks of %zu, medians:\n",
              blocks, kBlock);
  std::printf("  with frame pointers      %6.2f ns per exit\n", Median(fp));
  std::printf("  without frame pointers   %6.2f ns per exit\n", Median(nofp));
  std::printf("  two clock reads (%s)    %6.2f ns\n",
              std::string(exitscope::ToString(clock.source())).c_str(), Median(clocks));
  std::printf("  ratio exit / two clock reads          %.3f\n", Median(ratio_fp));
  std::printf("  ratio with / without frame pointers   %.3f\n", Median(ratio_nofp));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int captures = 200, blocks = 20000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--captures" || a == "--blocks") && i + 1 < argc) {
      const int v = std::atoi(argv[++i]);
      if (v <= 0) {
        std::fprintf(stderr, "%s: '%s' is not a positive number\n", a.c_str(), argv[i]);
        return 2;
      }
      (a == "--captures" ? captures : blocks) = v;
    } else {
      std::fprintf(stderr, "usage: stack_capture_benchmark [--captures N] [--blocks N]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (int rc = Captures(captures); rc != 0) return rc;
  return HotPath(blocks);
}
