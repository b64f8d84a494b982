// kvm_dat_floor_benchmark: `exitscope kvm report` on a real trace-cmd capture against the
// floor no reader goes below (loading its CPU data: decompressing the chunks), against
// `trace-cmd report` and against `perf script`, all in one run on the same capture.
//
//   build/bench/kvm_dat_floor_benchmark [CAPTURE.dat] [--record DIR [--iterations N]] [--runs N]
//
// CAPTURE: a .dat (default: the largest committed one under testdata/, excluding the crash
// files). --record DIR: where /dev/kvm is usable, first records an exit-heavy guest
// (`exitscope kvm record -e 'kvm:*' -- exitscope run --guest mmio-storm --vcpus 2
// --guest-arg N`, five userspace exits per iteration and vCPU: N = 60000 gives about 3 M
// records), converts it to version 7 with zstd chunks (`trace-cmd convert`, what trace-cmd
// 3.1 writes by default) and measures that; and records the same workload again under
// `perf record -e 'kvm:*'` for the perf script row. Without /dev/kvm it says so and measures
// CAPTURE: no perf.data of kvm events can be made on such a host (nothing fires them), so
// the perf row is left out, said so.
//
// Rows (wall clock, best of --runs, default 3):
//   open             KvmInput::Open: the layout checked, the formats parsed (in a child
//                    first); the same for every reader, left out of the next rows
//   floor            TraceCmdDat::LoadPagesOnly: every chunk decompressed, one thread
//   report, 1 thread the in-process report (KvmPairer + KvmAggregator fed by the reader, as
//                    `kvm report` runs them), fast path, EXITSCOPE_DAT_THREADS=1
//   report, checked  the same through the checked path (kbuffer) only
//   report           the same with the default threads (one per CPU stream on several cores,
//                    from 8 MiB of CPU data), then with one per stream forced
//   kvm report CLI   the exitscope binary, output discarded
//   trace-cmd report, perf script (when they can run)
// and the ratios: report / floor (issue 27 asks for <= 2) and trace-cmd report / kvm report
// (asks for >= 25 on a >= 1 M-event zstd capture).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "analysis/kvm_stats.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"
#include "sources/tracecmd_dat.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Best(int runs, const std::function<double()>& f) {
  double best = 1e300;
  for (int i = 0; i < runs; ++i) best = std::min(best, f());
  return best;
}

// Runs `cmd` through the shell, stdout to /dev/null; seconds, or -1 when it failed.
double TimeCommand(const std::string& cmd) {
  const auto t0 = Clock::now();
  const int st = std::system((cmd + " >/dev/null 2>&1").c_str());
  const auto t1 = Clock::now();
  return st == 0 ? Seconds(t0, t1) : -1;
}

bool Have(const char* tool) {
  return std::system(fmt::format("command -v {} >/dev/null 2>&1", tool).c_str()) == 0;
}

std::string LargestCommittedDat() {
  std::string best;
  uintmax_t size = 0;
  for (const auto& e :
       fs::recursive_directory_iterator(fs::path(EXITSCOPE_SOURCE_DIR) / "testdata")) {
    if (!e.is_regular_file() || e.path().extension() != ".dat") continue;
    if (e.path().string().find("/crashes/") != std::string::npos) continue;
    if (e.file_size() > size) {
      size = e.file_size();
      best = e.path().string();
    }
  }
  return best;
}

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "kvm_dat_floor_benchmark: %s\n", msg.c_str());
  std::exit(1);
}

// The in-process report, as `kvm report` runs it: KvmInput (which opens the .dat), KvmPairer,
// KvmAggregator; timed from after the open (see the open row) to the aggregated result.
// `threads` and `fast` through the reader's environment overrides.
double Report(const std::string& dat, int threads, bool fast, uint64_t* records, int* used) {
  ::setenv("EXITSCOPE_DAT_THREADS", std::to_string(threads).c_str(), 1);
  ::setenv("EXITSCOPE_DAT_FAST", fast ? "1" : "0", 1);
  auto in = exitscope::sources::KvmInput::Open(dat, {});
  if (!in) Die(in.error().message);
  const auto t0 = Clock::now();
  exitscope::analysis::KvmAggregator agg({});
  exitscope::sources::KvmPairer pairer({.clock = (*in)->scale()}, &agg);
  if (auto s = (*in)->ReadAll(&pairer); !s) Die(s.error().message);
  const double t = Seconds(t0, Clock::now());
  *records = (*in)->records_read();
  *used = (*in)->read_threads();
  ::unsetenv("EXITSCOPE_DAT_THREADS");
  ::unsetenv("EXITSCOPE_DAT_FAST");
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::string capture, record_dir;
  uint64_t iterations = 60000;
  int runs = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--record") && i + 1 < argc) {
      record_dir = argv[++i];
    } else if (!std::strcmp(argv[i], "--iterations") && i + 1 < argc) {
      iterations = std::strtoull(argv[++i], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (argv[i][0] != '-' && capture.empty()) {
      capture = argv[i];
    } else {
      std::fprintf(stderr, "usage: %s [CAPTURE.dat] [--record DIR [--iterations N]] [--runs N]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::string cli = std::string(EXITSCOPE_BINARY_DIR) + "/exitscope";
  std::string perf_data;
  if (!record_dir.empty()) {
    if (::access("/dev/kvm", R_OK | W_OK) != 0) {
      std::printf(
          "no usable /dev/kvm on this host: cannot record an exit-heavy capture (nor a "
          "perf.data of kvm events); measuring the given or largest committed capture\n");
    } else if (!fs::exists(cli)) {
      std::printf("exitscope binary not built at %s: cannot record\n", cli.c_str());
    } else {
      fs::create_directories(record_dir);
      const std::string guest =
          fmt::format("'{}' run --guest mmio-storm --vcpus 2 --guest-arg {}", cli, iterations);
      const std::string raw = record_dir + "/mmio-storm-v6.dat";
      const std::string z = record_dir + "/mmio-storm.dat";
      const std::string rec =
          fmt::format("'{}' kvm record -e 'kvm:*' -o '{}' -- {}", cli, raw, guest);
      std::printf("recording: %s\n", rec.c_str());
      if (TimeCommand(rec) < 0) Die("recording failed: " + rec);
      const std::string conv = fmt::format(
          "trace-cmd convert -i '{}' --file-version 7 --compression zstd -o '{}'", raw, z);
      capture = Have("trace-cmd") && TimeCommand(conv) >= 0 ? z : raw;
      std::printf("capture: %s%s\n", capture.c_str(),
                  capture == z ? " (version 7, zstd chunks)" : " (trace-cmd convert failed)");
      if (Have("perf")) {
        perf_data = record_dir + "/mmio-storm.perf.data";
        const std::string prec =
            fmt::format("perf record -q -e 'kvm:*' -o '{}' -- {}", perf_data, guest);
        if (TimeCommand(prec) < 0) {
          std::printf("perf record failed (%s): perf row left out\n", prec.c_str());
          perf_data.clear();
        }
      }
    }
  }
  if (capture.empty()) capture = LargestCommittedDat();
  if (capture.empty()) Die("no capture given and no .dat under testdata/");

  auto dat = exitscope::sources::TraceCmdDat::Open(capture);
  if (!dat) Die(dat.error().message);
  std::printf("capture %s: trace-cmd .dat v%d, %s, %.2f MB, %d CPUs, %u cores here\n",
              capture.c_str(), (*dat)->version(), (*dat)->compression().c_str(),
              static_cast<double>(fs::file_size(capture)) / 1e6, (*dat)->cpus(),
              std::thread::hardware_concurrency());

  uint64_t pages = 0, sum = 0;
  const double t_open = Best(runs, [&] {
    const auto t0 = Clock::now();
    auto d = exitscope::sources::KvmInput::Open(capture, {});
    if (!d) Die(d.error().message);
    return Seconds(t0, Clock::now());
  });
  const double t_floor = Best(runs, [&] {
    const auto t0 = Clock::now();
    if (auto s = (*dat)->LoadPagesOnly(&pages, &sum); !s) Die(s.error().message);
    return Seconds(t0, Clock::now());
  });
  uint64_t records = 0;
  int used = 0;
  const double t_one = Best(runs, [&] { return Report(capture, 1, true, &records, &used); });
  const double t_checked = Best(runs, [&] { return Report(capture, 1, false, &records, &used); });
  const double t_auto = Best(runs, [&] { return Report(capture, 0, true, &records, &used); });
  int forced_used = 0;
  const double t_forced =
      Best(runs, [&] { return Report(capture, 2, true, &records, &forced_used); });
  const auto row = [&](const char* what, double t, const std::string& note) {
    std::printf("%-34s %9.4f s %12.0f events/s %6.2fx floor  %s\n", what, t,
                static_cast<double>(records) / t, t / t_floor, note.c_str());
  };
  std::printf("%llu records, %llu pages (checksum %llx)\n",
              static_cast<unsigned long long>(records), static_cast<unsigned long long>(pages),
              static_cast<unsigned long long>(sum));
  row("open (layout, formats in a child)", t_open, "KvmInput::Open, not in the rows below");
  row("floor: load pages (decompress)", t_floor, "one thread");
  row("report, fast path, 1 thread", t_one, "in process: read, decode, pair, aggregate");
  row("report, checked path, 1 thread", t_checked, "every page through kbuffer");
  row("report, fast path, default", t_auto, fmt::format("{} reading thread(s)", used));
  row("report, fast path, threads forced", t_forced,
      fmt::format("{} reading thread(s): one per CPU stream", forced_used));

  double t_cli = -1;
  if (fs::exists(cli)) {
    t_cli = Best(runs, [&] {
      return TimeCommand(fmt::format("'{}' kvm report -i '{}' --percentiles", cli, capture));
    });
    if (t_cli > 0) row("exitscope kvm report -i FILE", t_cli, "the binary, output discarded");
  } else {
    std::printf("exitscope binary not built at %s: CLI row left out\n", cli.c_str());
  }
  double t_tc = -1;
  if (Have("trace-cmd")) {
    t_tc = Best(runs, [&] { return TimeCommand(fmt::format("trace-cmd report '{}'", capture)); });
    if (t_tc > 0) row("trace-cmd report FILE", t_tc, "output discarded");
  } else {
    std::printf("trace-cmd: not installed, row left out\n");
  }
  if (!perf_data.empty()) {
    const double t_perf =
        Best(runs, [&] { return TimeCommand(fmt::format("perf script -i '{}'", perf_data)); });
    if (t_perf > 0) {
      row("perf script -i perf.data", t_perf,
          "kvm:* of the same workload, recorded again (its own event count)");
    }
  } else {
    std::printf(
        "perf script: no perf.data of the same kvm events (needs --record on a host with "
        "/dev/kvm), row left out\n");
  }
  std::printf("ratio report/floor (in process, after open): %.2f with 1 thread, %.2f default\n",
              t_one / t_floor, t_auto / t_floor);
  std::printf("ratio fast path/checked path, 1 thread: %.2fx faster\n", t_checked / t_one);
  if (t_tc > 0 && t_cli > 0) {
    std::printf("ratio trace-cmd report/exitscope kvm report (whole processes): %.1fx\n",
                t_tc / t_cli);
  }
  if (records < 1'000'000) {
    std::printf(
        "note: %llu records, under the 1 M of issue 27's target: figures of a small "
        "capture (open and process start weigh more)\n",
        static_cast<unsigned long long>(records));
  }
  return 0;
}
