// bench/offcpu_stacks_switch_cost.cc: the cost of `--stacks` (offcpu_stacks.bpf.c) per context
// switch, measured without KVM: two threads of this process ping-pong a byte over two pipes
// (each blocks once per round trip), interleaved in rounds as
//   none     no program attached
//   filtered the program attached, the threads not inside an exit (a hash lookup per switch)
//   captured both threads marked inside an exit (MarkInside): every switch-out stores a kernel
//            and a user stack (bpf_get_stackid twice), every switch-in adds its period
// and prints the median ns per round trip of each, and the difference per captured switch
// (captures counted by the program). Root.
//
//   build/bench/offcpu_stacks_switch_cost [--rounds N] [--iterations N]
//
// What it does not give: the ns per KVM exit that --stacks adds over --bpf (that needs a
// guest: kvm_bpf_overhead --interleave has no --stacks window yet; docs/kvm-stacks.md).
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sources/bpf/bpf_offcpu_stacks.h"

using exitscope::sources::bpf::BpfOffCpuStacks;

namespace {

// One ping-pong of `n` round trips; returns ns per round trip.
double PingPong(int n) {
  int a[2], b[2];
  if (::pipe(a) != 0 || ::pipe(b) != 0) std::abort();
  std::thread peer([&] {
    char c;
    for (int i = 0; i < n; ++i) {
      if (::read(a[0], &c, 1) != 1 || ::write(b[1], &c, 1) != 1) std::abort();
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  char c = 'x';
  for (int i = 0; i < n; ++i) {
    if (::write(a[1], &c, 1) != 1 || ::read(b[0], &c, 1) != 1) std::abort();
  }
  const auto t1 = std::chrono::steady_clock::now();
  peer.join();
  for (int fd : {a[0], a[1], b[0], b[1]}) ::close(fd);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 30, iterations = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::atoi(argv[i + 1]);
  }
  auto opened = BpfOffCpuStacks::Open({.tgid = static_cast<uint32_t>(::getpid()), .slow_ns = 0});
  if (!opened) {
    std::printf("offcpu_stacks_switch_cost: not possible here: %s\n",
                opened.error().message.c_str());
    return 1;
  }
  BpfOffCpuStacks& s = **opened;
  std::vector<double> none, filtered, captured;
  for (int r = 0; r < rounds; ++r) {
    s.Detach();
    none.push_back(PingPong(iterations));
    if (!s.Attach()) return 1;
    filtered.push_back(PingPong(iterations));
    // captured: both threads marked. The peer is a new thread: mark it as it starts.
    {
      int a[2], b[2];
      if (::pipe(a) != 0 || ::pipe(b) != 0) return 1;
      std::atomic<bool> ready{false};
      const uint32_t pid = static_cast<uint32_t>(::getpid());
      std::thread peer([&] {
        if (!s.MarkInside(pid, static_cast<uint32_t>(::syscall(SYS_gettid)))) std::abort();
        ready = true;
        char c;
        for (int i = 0; i < iterations; ++i) {
          if (::read(a[0], &c, 1) != 1 || ::write(b[1], &c, 1) != 1) std::abort();
        }
      });
      while (!ready) std::this_thread::yield();
      if (!s.MarkInside(pid, static_cast<uint32_t>(::syscall(SYS_gettid)))) return 1;
      const auto t0 = std::chrono::steady_clock::now();
      char c = 'x';
      for (int i = 0; i < iterations; ++i) {
        if (::write(a[1], &c, 1) != 1 || ::read(b[0], &c, 1) != 1) return 1;
      }
      const auto t1 = std::chrono::steady_clock::now();
      peer.join();
      for (int fd : {a[0], a[1], b[0], b[1]}) ::close(fd);
      captured.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / iterations);
      // This thread leaves its exit: the next KVM_RUN (any fd: the program reads the cmd).
      ::ioctl(0, OS_KVM_RUN, 0);
      (void)s.TakeEnded();
    }
  }
  const double n = Median(none), f = Median(filtered), c = Median(captured);
  const auto counters = s.Counters();
  const double per_trip =
      static_cast<double>(counters.captures) / (static_cast<double>(rounds) * iterations);
  std::printf("offcpu_stacks_switch_cost: %d rounds of %d round trips (2 threads, 2 pipes)\n",
              rounds, iterations);
  std::printf("  none      %9.1f ns per round trip (median)\n", n);
  std::printf("  filtered  %9.1f ns per round trip: +%.1f ns (the program on every switch)\n", f,
              f - n);
  std::printf(
      "  captured  %9.1f ns per round trip: +%.1f ns; %.2f captures per round trip: "
      "+%.1f ns per captured switch (two stacks stored)\n",
      c, c - n, per_trip, per_trip > 0 ? (c - n) / per_trip : 0.0);
  std::printf("  captures %llu, stack drops %llu\n",
              static_cast<unsigned long long>(counters.captures),
              static_cast<unsigned long long>(counters.stack_drops));
  return 0;
}
