// kvm_report_benchmark: how fast `exitscope kvm report` reads kvm traces, against
// `trace-cmd report` on the same .dat and `perf script` on a perf.data, in one run.
//
//   build/bench/kvm_report_benchmark [--exits N] [--keep DIR]
//
// 1. Generates a trace-cmd .dat (version 6, written by the project's TraceDatWriter) holding
//    N userspace exits recorded the way the real kvm-pvm capture shows them
//    (testdata/kvm/pvm-user64-pio-mmio-hlt.dat): per PIO exit kvm_fpu load, kvm_emulate_insn,
//    kvm_pio, kvm_fpu unload, kvm_userspace_exit; per MMIO exit the same with
//    vcpu_match_mmio + kvm_mmio. Records are laid out by the real 6.18 format files and packed
//    into ring-buffer pages as the kernel does. This is SYNTHETIC data shaped like the capture
//    (no guest on this machine can produce millions of events).
// 2. Times, on that file: `trace-cmd report FILE > /dev/null`, exitscope's reader + pairing +
//    aggregation in this process, and the `exitscope kvm report -i FILE` binary.
// 3. perf: `perf script` cannot be given kvm events here (nothing fires kvm tracepoints on
//    this host), so it is timed on a perf.data of as many syscalls:sys_enter_getppid
//    tracepoint events, recorded now: the same per-event work for perf (parse a sample,
//    format a tracepoint with libtraceevent, print a line). Stated as such in the output.
// 4. The same capture converted by `trace-cmd convert` to version 7 with zstd chunks (what
//    trace-cmd 3.1.6 writes by default): both readers timed again.
// Prints events/s per reader and the ratios. Timings are wall clock, best of 3 runs.
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <traceevent/event-parse.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "analysis/kvm_stats.h"
#include "sources/kvm_dat_pages.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"
#include "sources/tracefs_dat.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string Slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Raw records of the kvm events, laid out by the real format files.
class Formats {
 public:
  explicit Formats(const fs::path& events_dir) {
    tep_ = tep_alloc();
    tep_set_long_size(tep_, 8);
    tep_set_file_bigendian(tep_, TEP_LITTLE_ENDIAN);
    tep_set_local_bigendian(tep_, TEP_LITTLE_ENDIAN);
    for (const auto& ent : fs::directory_iterator(events_dir / "kvm")) {
      std::string text = Slurp(ent.path() / "format");
      tep_event* ev = nullptr;
      tep_parse_format(tep_, &ev, text.data(), text.size(), "kvm");
    }
  }
  ~Formats() { tep_free(tep_); }
  std::vector<uint8_t> Build(const char* event, int pid,
                             std::initializer_list<std::pair<const char*, uint64_t>> fields) {
    tep_event* ev = tep_find_event_by_name(tep_, "kvm", event);
    if (ev == nullptr) {
      std::fprintf(stderr, "no format for kvm:%s\n", event);
      std::exit(1);
    }
    int size = 0;
    for (tep_format_field* f = ev->format.fields; f; f = f->next) {
      size = std::max(size, f->offset + f->size);
    }
    std::vector<uint8_t> d(static_cast<size_t>(size), 0);
    Put(d, tep_find_common_field(ev, "common_type"), static_cast<uint64_t>(ev->id));
    Put(d, tep_find_common_field(ev, "common_pid"), static_cast<uint64_t>(pid));
    for (const auto& [name, v] : fields) Put(d, tep_find_field(ev, name), v);
    return d;
  }

 private:
  static void Put(std::vector<uint8_t>& d, tep_format_field* f, uint64_t v) {
    if (f) std::memcpy(d.data() + f->offset, &v, std::min<size_t>(8, static_cast<size_t>(f->size)));
  }
  tep_handle* tep_;
};

// Copies the format files into a tracefs-shaped folder for TraceDatWriter.
fs::path MakeTracefsDir(const fs::path& work, const fs::path& formats) {
  const fs::path dir = work / "tracefs";
  fs::create_directories(dir);
  fs::copy(formats / "events", dir / "events",
           fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  std::ofstream(dir / "trace_clock") << "[local] global counter uptime perf mono mono_raw boot\n";
  std::ofstream(dir / "saved_cmdlines") << "16330 pvmx\n";
  return dir;
}

// Writes the synthetic capture; returns the number of records.
uint64_t GenerateDat(const fs::path& path, const fs::path& formats_dir, const fs::path& work,
                     uint64_t exits) {
  const fs::path tracefs = MakeTracefsDir(work, formats_dir);
  Formats f(tracefs / "events");
  exitscope::sources::TraceDatWriter::Layout layout;
  layout.tracefs_dir = tracefs.string();
  layout.systems = {"kvm"};
  layout.cpus = 1;
  auto w = exitscope::sources::TraceDatWriter::Create(path.string(), layout);
  if (!w) {
    std::fprintf(stderr, "kvm_report_benchmark: %s\n", w.error().message.c_str());
    std::exit(1);
  }
  exitscope::sources::RingPageWriter pages([&](const std::vector<uint8_t>& p) {
    if (auto s = (*w)->AddPage(0, p.data(), p.size()); !s) {
      std::fprintf(stderr, "kvm_report_benchmark: %s\n", s.error().message.c_str());
      std::exit(1);
    }
  });
  const int tid = 16330;
  const auto load = f.Build("kvm_fpu", tid, {{"load", 1}});
  const auto unload = f.Build("kvm_fpu", tid, {{"load", 0}});
  auto insn = f.Build("kvm_emulate_insn", tid, {{"rip", 0x1000}, {"len", 1}, {"flags", 9}});
  const auto pio =
      f.Build("kvm_pio", tid, {{"rw", 1}, {"port", 0x3f8}, {"size", 1}, {"count", 1}, {"val", 0}});
  const auto io_exit = f.Build("kvm_userspace_exit", tid, {{"reason", 2}});
  const auto match =
      f.Build("vcpu_match_mmio", tid, {{"gva", 0xd0000}, {"gpa", 0xd0000}, {"write", 1}});
  const auto mmio = f.Build("kvm_mmio", tid, {{"type", 2}, {"len", 4}, {"gpa", 0xd0000}});
  const auto mmio_exit = f.Build("kvm_userspace_exit", tid, {{"reason", 6}});
  uint64_t ts = 4'396'959'136'231, records = 0;
  auto add = [&](const std::vector<uint8_t>& r, uint64_t step) {
    ts += step;
    pages.Add(ts, r);
    ++records;
  };
  for (uint64_t i = 0; i < exits; ++i) {
    // Gaps as in the capture (ns): guest run, handling in the kernel, VMM time ~8-25 us.
    add(load, 9000 + (i * 7919) % 16000);
    add(insn, 28000);
    if (i % 2 == 0) {
      add(pio, 2300);
      add(unload, 2300);
      add(io_exit, 12000);
    } else {
      add(match, 2000);
      add(mmio, 500);
      add(unload, 2300);
      add(mmio_exit, 12000);
    }
  }
  add(load, 9000);
  pages.Flush();
  if (auto s = (*w)->Finish(tracefs.string()); !s) {
    std::fprintf(stderr, "kvm_report_benchmark: %s\n", s.error().message.c_str());
    std::exit(1);
  }
  return records;
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Runs `cmd` through the shell with stdout read and counted (lines); returns seconds.
double TimeCommand(const std::string& cmd, uint64_t* lines, int* status) {
  const auto t0 = Clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return 0;
  }
  static char buf[1 << 20];
  uint64_t n = 0;
  size_t got;
  while ((got = fread(buf, 1, sizeof(buf), p)) > 0) {
    for (size_t i = 0; i < got; ++i) n += buf[i] == '\n';
  }
  *status = pclose(p);
  const auto t1 = Clock::now();
  *lines = n;
  return Seconds(t0, t1);
}

template <typename F>
double Best(int runs, F&& f) {
  double best = 1e300;
  for (int i = 0; i < runs; ++i) best = std::min(best, f());
  return best;
}

bool Have(const char* tool) {
  return std::system(fmt::format("command -v {} >/dev/null 2>&1", tool).c_str()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t exits = 400'000;
  std::string keep;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--exits") && i + 1 < argc) {
      exits = std::strtoull(argv[++i], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--keep") && i + 1 < argc) {
      keep = argv[++i];
    } else if (!std::strcmp(argv[i], "--spin") && i + 1 < argc) {
      // Helper mode for the perf comparison: N getppid() calls.
      const uint64_t n = std::strtoull(argv[++i], nullptr, 10);
      for (uint64_t k = 0; k < n; ++k) syscall(SYS_getppid);
      return 0;
    } else {
      std::fprintf(stderr, "usage: %s [--exits N] [--keep DIR]\n", argv[0]);
      return 2;
    }
  }
  const fs::path formats = fs::path(EXITSCOPE_SOURCE_DIR) / "testdata/kvm/tracefs-pvm-6.18";
  if (!fs::exists(formats / "events/kvm/kvm_exit/format")) {
    std::fprintf(stderr, "kvm_report_benchmark: format files missing under %s\n", formats.c_str());
    return 1;
  }
  char tmpl[] = "/tmp/kvm-bench-XXXXXX";
  const fs::path work = keep.empty() ? fs::path(mkdtemp(tmpl)) : fs::path(keep);
  fs::create_directories(work);
  const fs::path dat = work / "synthetic-kvm.dat";

  const auto g0 = Clock::now();
  const uint64_t records = GenerateDat(dat, formats, work, exits);
  const auto g1 = Clock::now();
  std::printf(
      "generated %s: %llu exits, %llu kvm records, %.1f MB in %.2f s (synthetic, shaped "
      "like the real kvm-pvm capture)\n",
      dat.c_str(), static_cast<unsigned long long>(exits), static_cast<unsigned long long>(records),
      static_cast<double>(fs::file_size(dat)) / 1e6, Seconds(g0, g1));

  // exitscope in process: open + decode + pair + aggregate (what `kvm report` does).
  uint64_t paired = 0;
  bool mapped = false;
  const double t_lib = Best(3, [&] {
    const auto t0 = Clock::now();
    auto in = exitscope::sources::KvmInput::Open(dat.string(), {});
    if (!in) {
      std::fprintf(stderr, "kvm_report_benchmark: %s\n", in.error().message.c_str());
      std::exit(1);
    }
    exitscope::analysis::KvmAggregator agg({});
    exitscope::sources::KvmPairer pairer({.clock = (*in)->scale()}, &agg);
    if (auto s = (*in)->ReadAll(&pairer); !s) {
      std::fprintf(stderr, "kvm_report_benchmark: %s\n", s.error().message.c_str());
      std::exit(1);
    }
    paired = agg.analysis().all.samples;
    mapped = (*in)->used_mapped_reader();
    return Seconds(t0, Clock::now());
  });
  std::printf("%-40s %10.3f s %12.0f events/s  (%llu exits paired, %s)\n",
              "exitscope reader (in process)", t_lib, static_cast<double>(records) / t_lib,
              static_cast<unsigned long long>(paired),
              mapped ? "mapped pages" : "libtracecmd iterator");

  double t_cli = 0;
  const std::string cli = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope";
  if (fs::exists(cli)) {
    uint64_t lines = 0;
    int st = 0;
    t_cli = Best(3, [&] {
      return TimeCommand(fmt::format("'{}' kvm report -i '{}' --percentiles", cli, dat.string()),
                         &lines, &st);
    });
    std::printf("%-40s %10.3f s %12.0f events/s  (exit status %d)\n",
                "exitscope kvm report -i FILE", t_cli, static_cast<double>(records) / t_cli,
                WEXITSTATUS(st));
  } else {
    std::printf("exitscope kvm report: binary not built at %s, skipped\n", cli.c_str());
  }

  double t_tc = 0;
  if (Have("trace-cmd")) {
    uint64_t lines = 0;
    int st = 0;
    t_tc = Best(3, [&] {
      return TimeCommand(fmt::format("trace-cmd report '{}' 2>/dev/null", dat.string()), &lines,
                         &st);
    });
    std::printf("%-40s %10.3f s %12.0f events/s  (%llu lines, exit status %d)\n",
                "trace-cmd report FILE", t_tc, static_cast<double>(records) / t_tc,
                static_cast<unsigned long long>(lines), WEXITSTATUS(st));
  } else {
    std::printf("trace-cmd: not installed, skipped\n");
  }

  // The same capture as trace-cmd 3.1.6 writes it by default: version 7, zstd chunks.
  if (t_tc > 0 && fs::exists(cli)) {
    const fs::path z = work / "synthetic-kvm-v7-zstd.dat";
    const std::string conv = fmt::format(
        "trace-cmd convert -i '{}' --file-version 7 --compression zstd -o '{}' >/dev/null 2>&1",
        dat.string(), z.string());
    if (std::system(conv.c_str()) == 0) {
      uint64_t lines = 0;
      int st = 0;
      const double tz_cli = Best(3, [&] {
        return TimeCommand(fmt::format("'{}' kvm report -i '{}' --percentiles", cli, z.string()),
                           &lines, &st);
      });
      const double tz_tc = Best(3, [&] {
        return TimeCommand(fmt::format("trace-cmd report '{}' 2>/dev/null", z.string()), &lines,
                           &st);
      });
      std::printf("%-40s %10.3f s %12.0f events/s  (v7 zstd, %.1f MB)\n",
                  "exitscope kvm report -i FILE.zstd", tz_cli,
                  static_cast<double>(records) / tz_cli,
                  static_cast<double>(fs::file_size(z)) / 1e6);
      std::printf("%-40s %10.3f s %12.0f events/s\n", "trace-cmd report FILE.zstd", tz_tc,
                  static_cast<double>(records) / tz_tc);
      std::printf("ratio exitscope kvm report/trace-cmd report, zstd: %.1fx\n", tz_tc / tz_cli);
    } else {
      std::printf("trace-cmd convert failed (%s): compressed case skipped\n", conv.c_str());
    }
  }

  double t_perf = 0;
  uint64_t perf_events = 0;
  if (Have("perf")) {
    const fs::path pdata = work / "getppid.perf.data";
    const std::string rec = fmt::format(
        "perf record -q -m 4096 -e syscalls:sys_enter_getppid -o '{}' -- '{}' --spin {} "
        ">/dev/null 2>&1",
        pdata.string(), argv[0], records);
    if (std::system(rec.c_str()) == 0) {
      int st = 0;
      t_perf = Best(3, [&] {
        return TimeCommand(fmt::format("perf script -i '{}' 2>/dev/null", pdata.string()),
                           &perf_events, &st);
      });
      std::printf(
          "%-40s %10.3f s %12.0f events/s  (%llu syscalls:sys_enter_getppid events: "
          "perf cannot be given kvm events on this host)\n",
          "perf script -i perf.data", t_perf, static_cast<double>(perf_events) / t_perf,
          static_cast<unsigned long long>(perf_events));
    } else {
      std::printf("perf record failed (%s), perf skipped\n", rec.c_str());
    }
  } else {
    std::printf("perf: not installed, skipped\n");
  }

  const double lib_rate = static_cast<double>(records) / t_lib;
  const double cli_rate = t_cli > 0 ? static_cast<double>(records) / t_cli : 0;
  if (t_tc > 0) {
    const double tc_rate = static_cast<double>(records) / t_tc;
    std::printf("ratio exitscope(in process)/trace-cmd report: %.1fx\n", lib_rate / tc_rate);
    if (cli_rate > 0) {
      std::printf("ratio exitscope kvm report/trace-cmd report: %.1fx\n", cli_rate / tc_rate);
    }
  }
  if (t_perf > 0 && perf_events > 0) {
    const double perf_rate = static_cast<double>(perf_events) / t_perf;
    std::printf("ratio exitscope(in process)/perf script: %.1fx\n", lib_rate / perf_rate);
    if (cli_rate > 0) {
      std::printf("ratio exitscope kvm report/perf script: %.1fx\n", cli_rate / perf_rate);
    }
  }
  if (keep.empty()) fs::remove_all(work);
  return 0;
}
