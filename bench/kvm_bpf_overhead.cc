// kvm_bpf_overhead: what watching KVM exits from the kernel costs per exit, seven ways, on the
// same exit-heavy guest in one run:
//
//   none        the guest alone (nothing attached to the kvm tracepoints)
//   tracefs     `exitscope kvm live -p PID`: every kvm:* event streamed through tracefs ring
//               buffers, drained every 10 ms and paired in userspace
//   bpf-empty   the floor of bpf-run: a BPF program that only returns 0, attached (raw_tp,
//               the dispatch tp_btf uses) to the same two tracepoints, kvm_fpu and
//               kvm_userspace_exit, by this process: what running any program there costs
//   bpf-run     `exitscope kvm stat --bpf --bpf-pairing kvm-run -p PID`: the kvm-run pairing
//               (kvm_fpu + kvm_userspace_exit, the exit read from the vCPU's kvm_run; three
//               program runs per exit), aggregated in the kernel; the maps read at the end
//   bpf-run-io  the same with --event ioport: kvm_pio counted too (accesses handled in the
//               kernel)
//   bpf-btf     `--bpf-pairing tracepoints --bpf-attach tp_btf`: every kvm tracepoint paired
//               in the kernel as kvm report pairs them (about six program runs per exit)
//   bpf-tp      the same on classic tracepoints (the kernel builds each trace record)
//
// The guest (mmio-storm: MMIO and PIO register accesses, five userspace exits per iteration)
// runs in this process, unrecorded, while the watcher (the real exitscope binary) runs beside
// it, filtered on this process. Modes rotate every round (none, tracefs, bpf-empty, ...; then
// tracefs, bpf-empty, ..., none; ...) so drift hits all alike. Per run: wall time per userspace
// exit; per watcher run also the kvm records it counted per second and the records it lost.
// One more round, BPF modes only and not in the medians, reads the programs' own run time
// (--bpf-stats: BPF_ENABLE_STATS costs two clock reads per program run, so never in a timed
// round). Printed: each run, the medians, the cost each watcher adds per exit and the ratio
// bpf / tracefs of those costs. --vcpus N runs the guest on N vCPUs (N times the exit rate on
// N host CPUs): the events/s each watcher takes in and whether tracefs loses records at that
// rate; --buffer-kb K gives kvm live K KiB per-CPU ring buffers (smaller: it loses sooner).
//
//   build/bench/kvm_bpf_overhead [--rounds N] [--iterations N] [--vcpus N] [--buffer-kb K]
//   build/bench/kvm_bpf_overhead --interleave SECONDS [--window-ms MS] [--vcpus N]
//
// --interleave measures inside one guest run instead (below, before main): the figure of
// record, since the rounds pair runs seconds apart and the host drifts more than that.
//
// Without /dev/kvm, or without the exitscope binary, it prints one SKIP line and exits 0.
#include <dirent.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "sources/bpf/bpf_kvm_stat.h"
#include "sources/bpf/bpf_offcpu_stacks.h"
#include "sources/tracefs_session.h"
#include "vmm/vmm.h"

namespace {

using exitscope::vmm::Vmm;
using exitscope::vmm::VmmConfig;

const std::string kBin = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope";

struct RunResult {
  double ns_per_exit = -1;
  double seconds = 0;
  uint64_t exits = 0;
};

// mmio-storm for `iterations` on `vcpus` vCPUs, quiet, no dump.
VmmConfig Storm(uint64_t iterations, uint32_t vcpus, bool record) {
  VmmConfig c;
  c.guest = "mmio-storm";
  c.guest_arg = iterations;
  c.vcpus = vcpus;
  c.record = record;
  c.serial_quiet = true;
  c.write_dump = false;
  c.dump_signal = false;
  c.slow_ms = 1000;
  c.log = [](std::string_view) {};
  return c;
}

RunResult Guest(uint64_t iterations, int vcpus) {
  RunResult out;
  auto vmm = Vmm::Create(Storm(iterations, static_cast<uint32_t>(vcpus), false));
  if (!vmm) {
    std::fprintf(stderr, "kvm_bpf_overhead: %s\n", vmm.error().message.c_str());
    return out;
  }
  auto r = (*vmm)->Run();
  if (!r || !r->passed || r->userspace_exits == 0) {
    std::fprintf(stderr, "kvm_bpf_overhead: guest did not pass\n");
    return out;
  }
  out.seconds = r->elapsed_s;
  out.exits = r->userspace_exits;
  out.ns_per_exit = r->elapsed_s * 1e9 / static_cast<double>(r->userspace_exits);
  return out;
}

// The exitscope binary watching this process, its stdout in a file.
class Watcher {
 public:
  bool Start(const std::vector<std::string>& args) {
    char tmpl[] = "/tmp/kvm-bpf-bench-XXXXXX";
    char err_tmpl[] = "/tmp/kvm-bpf-bench-err-XXXXXX";
    out_fd_ = ::mkstemp(tmpl);
    err_fd_ = ::mkstemp(err_tmpl);
    path_ = tmpl;
    err_path_ = err_tmpl;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out_fd_, 1);
      ::dup2(err_fd_, 2);
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::usleep(1'500'000);  // load / attach / open the tracefs instance before the guest starts
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == 0) return true;
    pid_ = -1;  // exited (reaped): nothing for Stop() to signal
    return false;
  }
  // Stops it (SIGINT: it prints its final report) and returns the report's JSON; what it
  // wrote, if it already exited; null if it was never started.
  nlohmann::json Stop() {
    if (out_fd_ < 0) return nlohmann::json();
    if (pid_ > 0) {
      ::kill(pid_, SIGINT);
      int st = 0;
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
    }
    std::ifstream in(path_);
    std::string line, last;
    while (std::getline(in, line))
      if (!line.empty() && line[0] == '{') last = line;
    ::close(out_fd_);
    ::unlink(path_.c_str());
    std::ifstream err(err_path_);
    std::stringstream ss;
    ss << err.rdbuf();
    stderr_ = ss.str();
    ::close(err_fd_);
    ::unlink(err_path_.c_str());
    out_fd_ = err_fd_ = -1;
    return last.empty() ? nlohmann::json() : nlohmann::json::parse(last, nullptr, false);
  }

  const std::string& err() const { return stderr_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  std::string path_, err_path_, stderr_;
};

// A program that returns 0, on raw tracepoints (bpf-empty). No libbpf: two instructions.
// Attach() loads it (once) and attaches it to kvm_fpu and kvm_userspace_exit; Detach() closes
// the links and keeps the programs for the next Attach().
class EmptyPrograms {
 public:
  // clock: the program also calls bpf_ktime_get_ns() where bpf-run reads the clock, at the
  // kvm_fpu load and at kvm_userspace_exit (bpf-clock: the floor of a program that times
  // exits on these tracepoints).
  explicit EmptyPrograms(bool clock = false) : clock_(clock) {}
  ~EmptyPrograms() {
    Detach();
    for (int fd : progs_) ::close(fd);
  }
  bool Attach(std::string* why) {
    const char* const kTracepoints[] = {"kvm_fpu", "kvm_userspace_exit"};
    for (size_t i = progs_.size(); i < std::size(kTracepoints); ++i) {
      bpf_insn insns[5] = {};
      uint32_t n = 0;
      if (clock_) {
        // if (first argument) r0 = bpf_ktime_get_ns(): the kvm_fpu load (not the unload) and
        // every kvm_userspace_exit (its reason), the two clock reads of bpf-run per exit.
        insns[n].code = BPF_LDX | BPF_MEM | BPF_DW;  // r2 = ctx->args[0]
        insns[n].dst_reg = BPF_REG_2;
        insns[n++].src_reg = BPF_REG_1;
        insns[n].code = BPF_JMP | BPF_JEQ | BPF_K;  // if r2 == 0 skip the call
        insns[n].dst_reg = BPF_REG_2;
        insns[n++].off = 1;
        insns[n].code = BPF_JMP | BPF_CALL;
        insns[n++].imm = BPF_FUNC_ktime_get_ns;
      }
      insns[n].code = BPF_ALU64 | BPF_MOV | BPF_K;  // r0 = 0
      insns[n++].dst_reg = BPF_REG_0;
      insns[n++].code = BPF_JMP | BPF_EXIT;
      static const char kLicense[] = "GPL";
      bpf_attr load = {};
      load.prog_type = BPF_PROG_TYPE_RAW_TRACEPOINT;
      load.insns = reinterpret_cast<uint64_t>(insns);
      load.insn_cnt = n;
      load.license = reinterpret_cast<uint64_t>(kLicense);
      const int prog = static_cast<int>(::syscall(SYS_bpf, BPF_PROG_LOAD, &load, sizeof load));
      if (prog < 0) {
        *why = std::string("BPF_PROG_LOAD: ") + std::strerror(errno);
        return false;
      }
      progs_.push_back(prog);
    }
    for (size_t i = links_.size(); i < progs_.size(); ++i) {
      bpf_attr open = {};
      open.raw_tracepoint.name = reinterpret_cast<uint64_t>(kTracepoints[i]);
      open.raw_tracepoint.prog_fd = static_cast<uint32_t>(progs_[i]);
      const int link =
          static_cast<int>(::syscall(SYS_bpf, BPF_RAW_TRACEPOINT_OPEN, &open, sizeof open));
      if (link < 0) {
        *why =
            std::string("BPF_RAW_TRACEPOINT_OPEN ") + kTracepoints[i] + ": " + std::strerror(errno);
        return false;
      }
      links_.push_back(link);
    }
    return true;
  }
  void Detach() {
    for (int fd : links_) ::close(fd);
    links_.clear();
  }

 private:
  bool clock_;
  std::vector<int> progs_, links_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty()      ? 0
         : v.size() % 2 ? v[v.size() / 2]
                        : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

enum Mode { kNone = 0, kTracefs, kBpfEmpty, kBpfRun, kBpfRunIo, kBpfBtf, kBpfTp, kModes };
const char* const kModeNames[] = {"none",       "tracefs", "bpf-empty", "bpf-run",
                                  "bpf-run-io", "bpf-btf", "bpf-tp"};
constexpr int kFirstBpf = kBpfRun;
// kvm stat's options per BPF mode: the pairing, how it attaches, the table's event class.
const char* const kBpfArgs[kModes][6] = {
    {},
    {},
    {},
    {"--bpf-pairing", "kvm-run", "--bpf-attach", "tp_btf", "--event", "vmexit"},
    {"--bpf-pairing", "kvm-run", "--bpf-attach", "tp_btf", "--event", "ioport"},
    {"--bpf-pairing", "tracepoints", "--bpf-attach", "tp_btf", "--event", "vmexit"},
    {"--bpf-pairing", "tracepoints", "--bpf-attach", "tracepoint", "--event", "vmexit"},
};

// ---- --interleave: the watchers switched on and off inside one guest run ----------------
//
// The rounds above pair runs seconds apart, and this nested host's exit cost drifts by more
// than the watchers' costs over seconds. Here one guest runs for the whole measurement, every
// watcher is set up once, and they take turns in windows of --window-ms: none, tracefs, none,
// bpf-empty, none, bpf-clock, none, bpf-run, none, bpf-stacks, repeated. Switching a watcher on or
// off is what it takes to start or stop it without restarting it:
//   tracefs    `exitscope kvm live -p PID` runs throughout; the bench writes 0/1 to the
//              `enable` files of the events it enabled in its tracefs instance (off, the
//              tracepoints are off: no record is built, its reader finds nothing to read)
//   bpf-empty  the raw_tp links of the empty programs opened / closed
//   bpf-clock  the same with programs that call bpf_ktime_get_ns() where bpf-run does (the
//              kvm_fpu load, kvm_userspace_exit): the floor of any program that times exits
//              on these tracepoints
//   bpf-run    the library's BpfKvmStat (the programs of `kvm stat --bpf`, kvm-run pairing,
//              tp_btf) Attach()ed / Detach()ed
//   bpf-stacks bpf-run plus BpfOffCpuStacks (the program `--stacks` adds: sched_switch,
//              sys_enter_ioctl and the kvm tracepoints this kernel has), both attached /
//              detached: its cost minus bpf-run's is what `--stacks` adds per exit
// A window's cost per exit is its wall time over the userspace exits the VMM handled in it
// (the recorder's ring head: record = true in every window alike, ~30 ns of ~25 us). A
// watcher window is paired with the mean of the `none` windows just before and after it,
// 10-20 windows a second apart rather than a round. Each switch is followed by a settle time
// (--window-ms / 5) outside the window. The programs' own run time (BPF_ENABLE_STATS) is read
// in a last phase outside the windows.
class TracefsToggle {
 public:
  // The events kvm live enabled in its instance (events/SYS/EVENT/enable reading "1").
  bool Find(const std::string& instance_dir) {
    const std::string events = instance_dir + "/events";
    for (const char* sys : {"kvm", "kvmmmu"}) {
      const std::string sys_dir = events + "/" + sys;
      std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(sys_dir.c_str()), ::closedir);
      if (!d) continue;
      while (dirent* e = ::readdir(d.get())) {
        if (e->d_name[0] == '.') continue;
        const std::string f = sys_dir + "/" + e->d_name + "/enable";
        std::ifstream in(f);
        std::string v;
        if (in >> v && !v.empty() && v[0] == '1') files_.push_back(f);
      }
    }
    return !files_.empty();
  }
  bool Set(bool on) {
    for (const std::string& f : files_) {
      const int fd = ::open(f.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) return false;
      const bool ok = ::write(fd, on ? "1" : "0", 1) == 1;
      ::close(fd);
      if (!ok) return false;
    }
    return true;
  }
  size_t count() const { return files_.size(); }

 private:
  std::vector<std::string> files_;
};

uint64_t ExitsNow(Vmm& vmm, uint32_t vcpus) {
  uint64_t n = 0;
  for (uint32_t v = 0; v < vcpus; ++v) n += vmm.recorder()->ring_counters(v).written;
  return n;
}

double NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Spread {
  double median = 0, q1 = 0, q3 = 0, mean = 0, se = 0;
  size_t n = 0;
};
Spread SpreadOf(std::vector<double> v) {
  Spread s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))]; };
  s.median = Median(v);
  s.q1 = at(0.25);
  s.q3 = at(0.75);
  double sum = 0, sq = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  for (double x : v) sq += (x - s.mean) * (x - s.mean);
  if (v.size() > 1)
    s.se = std::sqrt(sq / static_cast<double>(v.size() - 1) / static_cast<double>(v.size()));
  return s;
}

int Interleave(double seconds, double window_ms, uint32_t vcpus) {
  namespace bpf = exitscope::sources::bpf;
  const std::string self = std::to_string(::getpid());
  // Runs until stopped; recorded: the ring heads count the exits of each window.
  VmmConfig c = Storm(1ull << 40, vcpus, true);
  c.events_per_vcpu = 4096;
  auto vmm = Vmm::Create(c);
  if (!vmm) {
    std::fprintf(stderr, "kvm_bpf_overhead: %s\n", vmm.error().message.c_str());
    return 1;
  }
  bool run_ok = false;
  std::thread guest([&] {
    auto r = (*vmm)->Run();
    run_ok = r && !r->fatal;
  });
  auto stop_guest = [&] {
    (*vmm)->RequestStop();
    guest.join();
  };
  Watcher live;
  // Every failure from here: one line, the watcher and the guest stopped, status 1.
  auto fail = [&](const std::string& line) {
    std::printf("interleave: %s\n", line.c_str());
    live.Stop();
    stop_guest();
    return 1;
  };
  const double boot = NowS();
  while (ExitsNow(**vmm, vcpus) < 1000 && NowS() - boot < 10) ::usleep(10'000);
  if (ExitsNow(**vmm, vcpus) < 1000) return fail("the guest did not start");

  // The watchers, each set up once and switched off.
  if (!live.Start(
          {kBin, "kvm", "live", "-p", self, "--format", "json", "-d", "3600", "--cumulative"})) {
    return fail("kvm live did not start");
  }
  auto tracefs = exitscope::sources::FindTracefs();
  TracefsToggle stream;
  if (!tracefs || !stream.Find(*tracefs + "/instances/exitscope-" + std::to_string(live.pid())) ||
      !stream.Set(false)) {
    return fail("cannot find or switch kvm live's events in its tracefs instance");
  }
  EmptyPrograms empty, clock(true);
  std::string why;
  if (!empty.Attach(&why) || !clock.Attach(&why)) return fail("bpf-empty/bpf-clock: " + why);
  empty.Detach();
  clock.Detach();
  bpf::BpfKvmOptions bo;
  bo.tgid = static_cast<uint32_t>(::getpid());
  bo.attach = bpf::BpfAttach::kTpBtf;
  bo.pairing = bpf::BpfPairing::kKvmRun;
  bo.access_kinds = 0;  // `kvm stat --bpf` with its default table (--event vmexit)
  auto run_stat = bpf::BpfKvmStat::Open(bo);
  if (!run_stat) return fail("bpf-run: " + run_stat.error().message);
  (*run_stat)->Detach();
  // --stacks: this process's threads, slow exits as `kvm stat` reports them (the guest's
  // exits are microseconds: the ring buffer stays empty, the cost is the tracking).
  auto stacks = bpf::BpfOffCpuStacks::Open({.tgid = static_cast<uint32_t>(::getpid())});
  if (!stacks) return fail("bpf-stacks: " + stacks.error().message);
  (*stacks)->Detach();

  enum Which { kOff = 0, kStream, kEmpty, kClock, kRun, kStacks, kWhich };
  const char* const kNames[kWhich] = {"none",      "tracefs", "bpf-empty",
                                      "bpf-clock", "bpf-run", "bpf-stacks"};
  auto set = [&](Which w, bool on) -> bool {
    switch (w) {
      case kStream:
        return stream.Set(on);
      case kEmpty:
        if (!on) return empty.Detach(), true;
        return empty.Attach(&why);
      case kClock:
        if (!on) return clock.Detach(), true;
        return clock.Attach(&why);
      case kRun:
        if (!on) return (*run_stat)->Detach(), true;
        return static_cast<bool>((*run_stat)->Attach());
      case kStacks:
        if (!on) return (*stacks)->Detach(), (*run_stat)->Detach(), true;
        if (exitscope::Status st = (*run_stat)->Attach(); !st)
          return why = st.error().message, false;
        if (exitscope::Status st = (*stacks)->Attach(); !st) return why = st.error().message, false;
        return true;
      default:
        return true;
    }
  };
  const Which kCycle[] = {kOff, kStream, kOff, kEmpty, kOff, kClock, kOff, kRun, kOff, kStacks};
  constexpr size_t kSteps = std::size(kCycle);
  std::printf(
      "interleave: guest mmio-storm, %u vCPU(s), %.0f s, windows of %.0f ms (settle %.0f ms), "
      "cycle none tracefs none bpf-empty none bpf-clock none bpf-run none bpf-stacks; kvm live -p "
      "%s (%zu events), bpf-run %s\n",
      vcpus, seconds, window_ms, window_ms / 5, self.c_str(), stream.count(),
      (*run_stat)->attachment().c_str());
  std::fflush(stdout);
  std::vector<double> window_ns;  // per window, in order
  std::vector<Which> window_mode;
  double stream_s = 0;
  const double t_end = NowS() + seconds;
  Which on = kOff;
  for (size_t i = 0; NowS() < t_end || i % kSteps != 1; ++i) {  // end on a `none`
    const Which w = kCycle[i % kSteps];
    if (w != on) {
      if (!set(on, false) || !set(w, true)) {
        set(on, false);
        return fail(std::string("cannot switch ") + kNames[w] + " on: " + why);
      }
      on = w;
    }
    ::usleep(static_cast<useconds_t>(window_ms * 200));  // settle: window / 5
    const uint64_t e0 = ExitsNow(**vmm, vcpus);
    const double t0 = NowS();
    ::usleep(static_cast<useconds_t>(window_ms * 1000));
    const uint64_t e1 = ExitsNow(**vmm, vcpus);
    const double t1 = NowS();
    if (e1 == e0) {
      set(on, false);
      return fail(std::string("no exit in a ") + kNames[w] + " window");
    }
    window_ns.push_back((t1 - t0) * 1e9 / static_cast<double>(e1 - e0));
    window_mode.push_back(w);
    if (w == kStream) stream_s += t1 - t0;
  }
  set(on, false);
  // The programs' own run time, outside the windows (BPF_ENABLE_STATS costs two clock reads
  // per program run).
  double prog_ns_per_exit = -1, prog_ns_per_run = -1;
  if ((*run_stat)->EnableRunTimeStats() && (*run_stat)->Attach()) {
    const auto r0 = (*run_stat)->ProgramRunTime();
    const uint64_t e0 = ExitsNow(**vmm, vcpus);
    ::usleep(2'000'000);
    const auto r1 = (*run_stat)->ProgramRunTime();
    const uint64_t e1 = ExitsNow(**vmm, vcpus);
    (*run_stat)->Detach();
    if (e1 > e0 && r1.runs > r0.runs) {
      prog_ns_per_exit = static_cast<double>(r1.ns - r0.ns) / static_cast<double>(e1 - e0);
      prog_ns_per_run = static_cast<double>(r1.ns - r0.ns) / static_cast<double>(r1.runs - r0.runs);
    }
  }
  stream.Set(true);  // as kvm live left them
  const nlohmann::json report = live.Stop();
  stop_guest();
  if (!run_ok) {
    std::printf("interleave: the guest failed\n");
    return 1;
  }

  // Pair every watcher window with the `none` windows on either side.
  std::vector<double> abs_ns[kWhich], cost[kWhich];
  for (size_t i = 0; i < window_ns.size(); ++i) {
    const Which w = window_mode[i];
    abs_ns[w].push_back(window_ns[i]);
    if (w == kOff || i == 0 || i + 1 >= window_ns.size()) continue;
    if (window_mode[i - 1] != kOff || window_mode[i + 1] != kOff) continue;
    cost[w].push_back(window_ns[i] - (window_ns[i - 1] + window_ns[i + 1]) / 2);
  }
  for (int w = 0; w < kWhich; ++w) {
    const Spread a = SpreadOf(abs_ns[w]);
    std::printf("interleave %-9s %4zu windows  %9.1f ns/exit median (IQR %.1f-%.1f)", kNames[w],
                a.n, a.median, a.q1, a.q3);
    if (w != kOff) {
      const Spread k = SpreadOf(cost[w]);
      std::printf("  added %+8.1f ns/exit median (IQR %+.1f to %+.1f), mean %+.1f +- %.1f (s.e.)",
                  k.median, k.q1, k.q3, k.mean, k.se);
    }
    std::printf("\n");
  }
  const Spread st = SpreadOf(cost[kStream]);
  if (report.is_object() && report.contains("pairing") && stream_s > 0) {
    const uint64_t records = report["pairing"]["records_total"].get<uint64_t>();
    std::printf(
        "interleave tracefs: %llu records in %.1f s of windows (%.0f events/s), lost %llu\n",
        static_cast<unsigned long long>(records), stream_s, static_cast<double>(records) / stream_s,
        static_cast<unsigned long long>(report["pairing"]["lost_events"].get<uint64_t>()));
  }
  if (prog_ns_per_exit >= 0) {
    std::printf(
        "interleave bpf-run programs (kernel run time, BPF_ENABLE_STATS, 2 s): %.1f ns per run, "
        "%.1f ns per exit\n",
        prog_ns_per_run, prog_ns_per_exit);
  }
  {
    // What --stacks adds over --bpf alone: bpf-stacks' cost minus bpf-run's (both against the
    // `none` windows beside them).
    const Spread k = SpreadOf(cost[kStacks]), r = SpreadOf(cost[kRun]);
    if (k.n != 0 && r.n != 0) {
      std::printf(
          "interleave --stacks over --bpf: %+.1f ns/exit (medians), %+.1f +- %.1f (means)\n",
          k.median - r.median, k.mean - r.mean, std::sqrt(k.se * k.se + r.se * r.se));
    }
  }
  if (st.median > 0) {
    for (int w : {kEmpty, kClock, kRun, kStacks}) {
      const Spread k = SpreadOf(cost[w]);
      // The ratio of means, with its standard error from the two s.e.s (first order).
      const double r = k.mean / st.mean;
      const double r_se =
          std::fabs(r) * std::sqrt(std::pow(k.se / k.mean, 2) + std::pow(st.se / st.mean, 2));
      std::printf("interleave %s cost / tracefs cost: %.3f (medians), %.3f +- %.3f (means)\n",
                  kNames[w], k.median / st.median, r, r_se);
    }
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  uint64_t iterations = 20000;
  int vcpus = 1;
  std::string buffer_kb;
  double interleave_s = 0, window_ms = 100;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--rounds" || a == "--iterations" || a == "--vcpus" || a == "--buffer-kb" ||
         a == "--interleave" || a == "--window-ms") &&
        i + 1 < argc) {
      char* end = nullptr;
      const double v = std::strtod(argv[++i], &end);
      const bool whole = a != "--interleave" && a != "--window-ms";
      if (end == argv[i] || *end != '\0' || !std::isfinite(v) || v < 1 || v > 1e9 ||
          (whole && v != std::floor(v))) {
        std::fprintf(stderr, "kvm_bpf_overhead: %s must be a %s from 1 to 1e9\n", a.c_str(),
                     whole ? "whole number" : "number");
        return 2;
      }
      if (a == "--rounds")
        rounds = static_cast<int>(v);
      else if (a == "--buffer-kb")
        buffer_kb = std::to_string(static_cast<long>(v));
      else if (a == "--vcpus")
        vcpus = static_cast<int>(std::min(v, 16.0));
      else if (a == "--interleave")
        interleave_s = v;
      else if (a == "--window-ms")
        window_ms = v;
      else
        iterations = static_cast<uint64_t>(v);
    } else {
      std::fprintf(stderr,
                   "usage: kvm_bpf_overhead [--rounds N] [--iterations N] [--vcpus N] "
                   "[--buffer-kb K] [--interleave SECONDS [--window-ms MS]]\n");
      return 2;
    }
  }
  const int kvm = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (kvm < 0) {
    std::printf("SKIP: /dev/kvm not available (%s): kvm_bpf_overhead boots guests\n",
                std::strerror(errno));
    return 0;
  }
  ::close(kvm);
  if (::access(kBin.c_str(), X_OK) != 0) {
    std::printf("SKIP: %s not built\n", kBin.c_str());
    return 0;
  }
  if (interleave_s > 0) return Interleave(interleave_s, window_ms, static_cast<uint32_t>(vcpus));
  const std::string self = std::to_string(::getpid());
  std::printf(
      "guest mmio-storm, %llu iterations x 5 exits, %d vCPU(s), %d rounds, watchers -p %s%s\n",
      static_cast<unsigned long long>(iterations), vcpus, rounds, self.c_str(),
      buffer_kb.empty() ? "" : (", kvm live --buffer-kb " + buffer_kb).c_str());
  if (Guest(iterations, vcpus).ns_per_exit < 0) return 1;  // warm-up

  std::vector<double> ns[kModes], events_per_s[kModes], prog_ns_per_hit[kModes],
      prog_ns_per_exit[kModes];
  uint64_t lost[kModes] = {};
  std::string attachment[kModes];
  // Rounds 1..rounds time the guest; one more round, BPF modes only and not timed, reads the
  // programs' own run time (--bpf-stats), which would otherwise add its cost to the timed runs.
  for (int r = 0; r <= rounds; ++r) {
    const bool stats_round = r == rounds;
    for (int k = 0; k < kModes; ++k) {
      const Mode m = static_cast<Mode>((r + k) % kModes);
      const bool bpf_mode = m >= kFirstBpf;
      if (stats_round && !bpf_mode) continue;
      EmptyPrograms empty;
      std::string why;
      if (m == kBpfEmpty && !empty.Attach(&why)) {
        std::printf("bpf-empty: not measured (%s)\n", why.c_str());
        return 1;
      }
      Watcher w;
      std::vector<std::string> live = {kBin,       "kvm",  "live", "-p",   self,
                                       "--format", "json", "-d",   "3600", "--cumulative"};
      if (!buffer_kb.empty()) live.insert(live.end(), {"--buffer-kb", buffer_kb});
      if (m == kTracefs && !w.Start(live)) {
        std::printf("tracefs: not measured (kvm live did not start)\n");
        return 1;
      }
      // --bpf-stats only in the untimed round: BPF_ENABLE_STATS adds two clock reads per run.
      std::vector<std::string> bpf = {kBin, "kvm", "stat", "--bpf", "-p", self, "--format", "json"};
      if (bpf_mode) bpf.insert(bpf.end(), std::begin(kBpfArgs[m]), std::end(kBpfArgs[m]));
      if (stats_round) bpf.insert(bpf.begin() + 3, "--bpf-stats");
      if (bpf_mode && !w.Start(bpf)) {
        std::printf("%s: not measured (kvm stat --bpf did not start)\n", kModeNames[m]);
        return 1;
      }
      const RunResult g = Guest(iterations, vcpus);
      if (g.ns_per_exit < 0) return 1;
      std::string extra;
      if (m != kNone && m != kBpfEmpty) {
        const nlohmann::json j = w.Stop();
        if (!j.is_object() || !j.contains("pairing")) {
          std::printf("%s: no report from the watcher\n", kModeNames[m]);
          return 1;
        }
        if (bpf_mode &&
            j.at("input").at("format").get<std::string>().find("eBPF") == std::string::npos) {
          std::printf("%s: kvm stat fell back to tracefs (BPF not possible here): %s\n",
                      kModeNames[m], w.err().c_str());
          return 1;
        }
        const uint64_t records = j["pairing"]["records_total"].get<uint64_t>();
        const uint64_t lost_now = j["pairing"]["lost_events"].get<uint64_t>();
        lost[m] += lost_now;
        const double eps = static_cast<double>(records) / g.seconds;
        if (!stats_round) events_per_s[m].push_back(eps);
        extra = "  " + std::to_string(records) + " records, " +
                std::to_string(static_cast<uint64_t>(eps)) + " events/s, lost " +
                std::to_string(lost_now);
        // kvm stat --bpf-stats: "BPF programs ran N times, X ns per run (kernel run time)"
        const size_t at = w.err().find("ns per run");
        if (bpf_mode && at != std::string::npos) {
          const size_t from = w.err().rfind(", ", at);
          const double per_run = std::strtod(w.err().c_str() + from + 2, nullptr);
          prog_ns_per_hit[m].push_back(per_run);
          prog_ns_per_exit[m].push_back(per_run * static_cast<double>(records) /
                                        static_cast<double>(g.exits));
          const size_t as = w.err().find("attached as ", at);
          if (as != std::string::npos) {
            attachment[m] = w.err().substr(as + 12);
            while (!attachment[m].empty() && attachment[m].back() == '\n') attachment[m].pop_back();
          }
          extra += ", program " + std::to_string(per_run).substr(0, 6) + " ns/hit";
        }
      }
      if (!stats_round) ns[m].push_back(g.ns_per_exit);
      std::printf("%s %d %-8s %10.1f ns/exit%s\n", stats_round ? "stats" : "round", r + 1,
                  kModeNames[m], g.ns_per_exit, extra.c_str());
      std::fflush(stdout);
    }
  }
  const double none = Median(ns[kNone]);
  // The cost of a watcher: per round, its run minus that round's `none` (the machine drifts by
  // more than the costs between rounds; within a round the modes run back to back).
  double cost[kModes] = {};
  std::printf("median none       %10.1f ns/exit\n", none);
  for (int m = kTracefs; m < kModes; ++m) {
    std::vector<double> paired;
    for (size_t r = 0; r < ns[m].size() && r < ns[kNone].size(); ++r)
      paired.push_back(ns[m][r] - ns[kNone][r]);
    cost[m] = Median(paired);
    const double v = Median(ns[m]);
    std::printf(
        "median %-10s %10.1f ns/exit  (+%.1f ns/exit paired by round, ratio %.4f)  %.0f "
        "events/s, lost %llu\n",
        kModeNames[m], v, cost[m], v / none, Median(events_per_s[m]),
        static_cast<unsigned long long>(lost[m]));
  }
  for (int m = kFirstBpf; m < kModes; ++m) {
    if (prog_ns_per_hit[m].empty()) continue;
    std::printf(
        "%s programs (kernel run time, BPF_ENABLE_STATS): %.1f ns per tracepoint hit, "
        "%.1f ns per exit; attached as %s\n",
        kModeNames[m], Median(prog_ns_per_hit[m]), Median(prog_ns_per_exit[m]),
        attachment[m].c_str());
  }
  if (cost[kTracefs] > 0) {
    std::printf(
        "bpf-empty (the floor of bpf-run: any program on its tracepoints) cost / tracefs "
        "cost %.3f; bpf-run beyond it +%.1f ns/exit\n",
        cost[kBpfEmpty] / cost[kTracefs], cost[kBpfRun] - cost[kBpfEmpty]);
    for (int m = kFirstBpf; m < kModes; ++m) {
      std::printf("%s cost / tracefs cost %.3f\n", kModeNames[m], cost[m] / cost[kTracefs]);
    }
  }
  return 0;
}
