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
//
// Without /dev/kvm, or without the exitscope binary, it prints one SKIP line and exits 0.
#include <fcntl.h>
#include <linux/bpf.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
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

RunResult Guest(uint64_t iterations, int vcpus) {
  VmmConfig c;
  c.guest = "mmio-storm";
  c.guest_arg = iterations;
  c.vcpus = vcpus;
  c.record = false;
  c.serial_quiet = true;
  c.write_dump = false;
  c.dump_signal = false;
  c.slow_ms = 1000;
  c.log = [](std::string_view) {};
  RunResult out;
  auto vmm = Vmm::Create(c);
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
    return ::waitpid(pid_, &st, WNOHANG) == 0;
  }
  // Stops it (SIGINT: it prints its final report) and returns the report's JSON.
  nlohmann::json Stop() {
    ::kill(pid_, SIGINT);
    int st = 0;
    ::waitpid(pid_, &st, 0);
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
    return last.empty() ? nlohmann::json() : nlohmann::json::parse(last, nullptr, false);
  }

  const std::string& err() const { return stderr_; }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  std::string path_, err_path_, stderr_;
};

// A program that returns 0, on raw tracepoints (bpf-empty). No libbpf: two instructions.
class EmptyPrograms {
 public:
  ~EmptyPrograms() {
    for (int fd : fds_) ::close(fd);
  }
  bool Attach(std::string* why) {
    for (const char* tp : {"kvm_fpu", "kvm_userspace_exit"}) {
      bpf_insn insns[2] = {};
      insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K;  // r0 = 0
      insns[0].dst_reg = BPF_REG_0;
      insns[1].code = BPF_JMP | BPF_EXIT;
      static const char kLicense[] = "GPL";
      bpf_attr load = {};
      load.prog_type = BPF_PROG_TYPE_RAW_TRACEPOINT;
      load.insns = reinterpret_cast<uint64_t>(insns);
      load.insn_cnt = 2;
      load.license = reinterpret_cast<uint64_t>(kLicense);
      const int prog = static_cast<int>(::syscall(SYS_bpf, BPF_PROG_LOAD, &load, sizeof load));
      if (prog < 0) {
        *why = std::string("BPF_PROG_LOAD: ") + std::strerror(errno);
        return false;
      }
      fds_.push_back(prog);
      bpf_attr open = {};
      open.raw_tracepoint.name = reinterpret_cast<uint64_t>(tp);
      open.raw_tracepoint.prog_fd = static_cast<uint32_t>(prog);
      const int link =
          static_cast<int>(::syscall(SYS_bpf, BPF_RAW_TRACEPOINT_OPEN, &open, sizeof open));
      if (link < 0) {
        *why = std::string("BPF_RAW_TRACEPOINT_OPEN ") + tp + ": " + std::strerror(errno);
        return false;
      }
      fds_.push_back(link);
    }
    return true;
  }

 private:
  std::vector<int> fds_;
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

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  uint64_t iterations = 20000;
  int vcpus = 1;
  std::string buffer_kb;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--rounds" || a == "--iterations" || a == "--vcpus" || a == "--buffer-kb") &&
        i + 1 < argc) {
      const long v = std::strtol(argv[++i], nullptr, 10);
      if (v < 1) {
        std::fprintf(stderr, "kvm_bpf_overhead: %s must be positive\n", a.c_str());
        return 2;
      }
      if (a == "--rounds")
        rounds = static_cast<int>(v);
      else if (a == "--buffer-kb")
        buffer_kb = std::to_string(v);
      else if (a == "--vcpus")
        vcpus = static_cast<int>(std::min(v, 16L));
      else
        iterations = static_cast<uint64_t>(v);
    } else {
      std::fprintf(stderr,
                   "usage: kvm_bpf_overhead [--rounds N] [--iterations N] [--vcpus N] "
                   "[--buffer-kb K]\n");
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
