// vmm_overhead: what recording every exit costs on the round trip of a real exit.
//
// Boots the same exit-heavy guest (mmio-storm: MMIO and PIO register accesses, five
// userspace exits per iteration) with the recorder on and off, alternating (on/off, then
// off/on, ...) in one run, and prints the wall time per userspace exit of each run, the
// medians, and a final line `ratio R` (recorded / not recorded). With --with-tracepoints it
// also runs, unrecorded, with every kvm:* tracepoint enabled in tracefs (restored after), to
// put the recorder's cost next to the kernel's tracing cost for the same workload.
//
// Without /dev/kvm it prints one SKIP line and exits 0: there is nothing to measure.
#include <fcntl.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "vmm/vmm.h"

namespace {

using exitscope::vmm::Vmm;
using exitscope::vmm::VmmConfig;

struct Options {
  int rounds = 5;
  uint64_t iterations = 40000;
  uint32_t vcpus = 1;
  bool tracepoints = false;
};

// ns per userspace exit of one run, or < 0 on failure (message printed).
double OneRun(const Options& o, bool record) {
  VmmConfig c;
  c.guest = "mmio-storm";
  c.guest_arg = o.iterations;
  c.vcpus = o.vcpus;
  c.record = record;
  c.serial_quiet = true;
  c.write_dump = false;
  c.dump_signal = false;
  c.slow_ms = 1000;
  c.log = [](std::string_view) {};
  auto vmm = Vmm::Create(c);
  if (!vmm) {
    std::fprintf(stderr, "vmm_overhead: %s\n", vmm.error().message.c_str());
    return -1;
  }
  auto r = (*vmm)->Run();
  if (!r) {
    std::fprintf(stderr, "vmm_overhead: %s\n", r.error().message.c_str());
    return -1;
  }
  if (!r->passed || r->userspace_exits == 0) {
    std::fprintf(stderr, "vmm_overhead: guest did not pass (%s)\n", r->fatal_detail.c_str());
    return -1;
  }
  return r->elapsed_s * 1e9 / static_cast<double>(r->userspace_exits) * o.vcpus;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty()      ? 0
         : v.size() % 2 ? v[v.size() / 2]
                        : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Enables every kvm:* event, remembering each one's previous state; restores on destruction.
class KvmTracepoints {
 public:
  bool Enable(std::string* why) {
    const std::string dir = "/sys/kernel/tracing/events/kvm";
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) {
      *why = dir + ": " + std::strerror(errno);
      return false;
    }
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string p = dir + "/" + e->d_name + "/enable";
      std::ifstream in(p);
      std::string v;
      if (!(in >> v)) continue;
      saved_.emplace_back(p, v);
      if (!Write(p, "1")) *why = p + ": " + std::strerror(errno);
    }
    closedir(d);
    return why->empty() && !saved_.empty();
  }
  ~KvmTracepoints() {
    for (const auto& [p, v] : saved_) Write(p, v);
  }

 private:
  static bool Write(const std::string& p, const std::string& v) {
    const int fd = open(p.c_str(), O_WRONLY);
    if (fd < 0) return false;
    const bool ok = write(fd, v.data(), v.size()) == static_cast<ssize_t>(v.size());
    close(fd);
    return ok;
  }
  std::vector<std::pair<std::string, std::string>> saved_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "vmm_overhead: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--rounds") {
      o.rounds = std::atoi(next("--rounds"));
    } else if (a == "--iterations") {
      o.iterations = std::strtoull(next("--iterations"), nullptr, 10);
    } else if (a == "--vcpus") {
      o.vcpus = static_cast<uint32_t>(std::atoi(next("--vcpus")));
    } else if (a == "--with-tracepoints") {
      o.tracepoints = true;
    } else {
      std::fprintf(stderr,
                   "usage: vmm_overhead [--rounds N] [--iterations N] [--vcpus N] "
                   "[--with-tracepoints]\n");
      return 2;
    }
  }
  if (o.rounds < 1 || o.iterations < 1 || o.vcpus < 1 || o.vcpus > ES_MAX_VCPUS) {
    std::fprintf(stderr,
                 "vmm_overhead: --rounds, --iterations, --vcpus must be positive (vcpus <= 16)\n");
    return 2;
  }
  const int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (kvm < 0) {
    std::printf("SKIP: /dev/kvm not available (%s): vmm_overhead boots guests and needs KVM\n",
                std::strerror(errno));
    return 0;
  }
  close(kvm);
  std::printf("guest mmio-storm, %llu iterations x 5 exits per vCPU, %u vCPU(s), %d rounds\n",
              static_cast<unsigned long long>(o.iterations), o.vcpus, o.rounds);
  std::vector<double> on, off, traced;
  if (OneRun(o, true) < 0) return 1;  // warm-up: page cache, guest memory, CPU frequency
  for (int r = 0; r < o.rounds; ++r) {
    const bool record_first = r % 2 == 0;
    for (int k = 0; k < 2; ++k) {
      const bool record = (k == 0) == record_first;
      const double ns = OneRun(o, record);
      if (ns < 0) return 1;
      (record ? on : off).push_back(ns);
      std::printf("round %d %-12s %10.1f ns/exit\n", r + 1, record ? "recorded" : "not-recorded",
                  ns);
    }
  }
  std::printf("median recorded      %10.1f ns/exit\n", Median(on));
  std::printf("median not-recorded  %10.1f ns/exit\n", Median(off));
  if (o.tracepoints) {
    KvmTracepoints tp;
    std::string why;
    if (!tp.Enable(&why)) {
      std::printf("kvm tracepoints: not measured (%s)\n", why.c_str());
    } else {
      for (int r = 0; r < o.rounds; ++r) {
        const double ns = OneRun(o, false);
        if (ns < 0) return 1;
        traced.push_back(ns);
      }
      std::printf(
          "median kvm-tracepoints %8.1f ns/exit (not recorded, all kvm:* events on), "
          "ratio %.4f\n",
          Median(traced), Median(traced) / Median(off));
    }
  }
  std::printf("ratio %.4f\n", Median(on) / Median(off));
  return 0;
}
