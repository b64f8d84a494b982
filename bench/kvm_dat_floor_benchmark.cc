// kvm_dat_floor_benchmark: `exitscope kvm report` on a real trace-cmd capture against the
// floor no reader goes below (loading its CPU data: decompressing the chunks), against
// `trace-cmd report` and against `perf script`, all in one run on the same capture.
//
//   build/bench/kvm_dat_floor_benchmark [CAPTURE.dat] [--record DIR [--iterations N]]
//       [--tile N [--keep DIR]] [--runs N]
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
// --tile N: measures instead a capture built from a real one (CAPTURE, default
// testdata/kvm/pvm-user64-pio-mmio-hlt.dat): its CPU data repeated N times, each CPU's
// ring-buffer pages on the same CPU, byte for byte but for the page header's timestamp,
// shifted by k * (span + 1 %) for repetition k; its own metadata (header_page, every event
// format, clock). Built with trace-cmd: `convert --file-version 6` of CAPTURE, the v6 CPU
// data repeated, then `convert --file-version 7 --compression zstd`; in a temporary directory,
// or DIR with --keep (tiled.dat). Derived data, not a new recording, and said so: real
// entropy for the floor (a synthetic capture compresses 30x), the real format count for the
// open, where no large capture can be recorded. An exit still open at the end of one
// repetition pairs with its vCPU's first entry of the next. Without trace-cmd it says so and
// exits 0.
//
// Rows (wall clock, best of --runs rounds, default 3; each round runs every in-process row
// once, then the whole processes, so that a slow spell of a shared host hits every row):
//   open             KvmInput::Open: the layout checked, the formats parsed (in a child
//                    first); the same for every reader, left out of the next rows
//   floor            TraceCmdDat::LoadPagesOnly: every chunk decompressed, one thread
//   report, 1 thread the in-process report (KvmPairer, then KvmAggregator and DiagnosisBuilder
//                    on a tee, as `kvm report` runs them), fast path, EXITSCOPE_DAT_THREADS=1
//   report, checked  the same through the checked path (kbuffer) only
//   report           the same with the default threads (on several cores, from 8 MiB of
//                    decompressed CPU data: threads reading time segments, with how many
//                    segments a thread read and the calling one took), then with one
//                    decompressing thread per compressed CPU stream instead, forced
//                    (EXITSCOPE_DAT_SEGMENT_CHUNKS=0)
//   where it goes    the default read again, with the aggregator alone on the tee (no
//                    diagnosis), and with no analysis (each exit only counted): what the
//                    reader and pairer cost, and what each analysis adds to it
//   kvm report CLI   the exitscope binary, output discarded
//   trace-cmd report, perf script (when they can run)
// The floor, one-thread and default rows add the page faults of their last round (MinorFaults).
// Then the ratios: report / floor (issue 27 asks for <= 2) and trace-cmd report / kvm report
// (asks for >= 25 on a >= 1 M-event zstd capture).
// With --tile, a first line says what was built ("tiled capture: ...'s CPU data repeated N
// times ... derived data, not a new recording": records, size, version, compression); the
// rows and ratios are those of any capture, and the records read must be those the tiled
// pages hold (else a MISMATCH line, exit 1).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "analysis/diagnosis.h"
#include "analysis/kvm_stats.h"
#include "sources/kvm_input.h"
#include "sources/kvm_pairing.h"
#include "sources/ring_page.h"
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

// Page faults of this process so far (every thread): each costs microseconds in a guest whose
// page tables the hypervisor checks (6-12 us in the kvm-pvm guests here, docs/trace-files.md).
uint64_t MinorFaults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_minflt);
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

// The in-process report, as `kvm report` runs it (cli/report_pipeline.cc): KvmInput (which
// opens the .dat), KvmPairer, and the KvmAggregator and DiagnosisBuilder on one tee; timed from
// after the open (see the open row) to the aggregated result and its diagnosis, the rendering
// of the text left out.
// `threads`, `fast` and segments (default, or none) through the reader's environment
// overrides.
std::string LastSegments;  // of the last in-process report read in time segments

// What the tee feeds: both analyses (the report), the aggregator alone, or neither (a sink
// that only counts the exits).
enum class Analysis { kReport, kAggregateOnly, kNone };

double Report(const std::string& dat, int threads, bool fast, uint64_t* records, int* used,
              uint64_t* faults = nullptr, bool segments = true,
              Analysis analysis = Analysis::kReport) {
  ::setenv("EXITSCOPE_DAT_THREADS", std::to_string(threads).c_str(), 1);
  if (!segments) ::setenv("EXITSCOPE_DAT_SEGMENT_CHUNKS", "0", 1);
  ::setenv("EXITSCOPE_DAT_FAST", fast ? "1" : "0", 1);
  auto in = exitscope::sources::KvmInput::Open(dat, {});
  if (!in) Die(in.error().message);
  const uint64_t f0 = MinorFaults();
  const auto t0 = Clock::now();
  exitscope::analysis::KvmAggregator agg({});
  exitscope::analysis::DiagnosisBuilder diag(exitscope::analysis::KvmDiagnosisOptions(agg));
  struct Counter final : exitscope::EventSink {
    uint64_t exits = 0;
    void OnExit(const exitscope::ExitEvent&) override { ++exits; }
  } counter;
  exitscope::TeeSink both({&agg, &diag}), agg_only({&agg}), none({&counter});
  exitscope::TeeSink& tee = analysis == Analysis::kReport          ? both
                            : analysis == Analysis::kAggregateOnly ? agg_only
                                                                   : none;
  exitscope::sources::KvmPairer pairer({.clock = (*in)->scale()}, &tee);
  if (auto s = (*in)->ReadAll(&pairer); !s) Die(s.error().message);  // ends with Finish()
  agg.Finish();
  const exitscope::analysis::Diagnosis diagnosis = diag.Finish();
  const double t = Seconds(t0, Clock::now());
  if (faults != nullptr) *faults = MinorFaults() - f0;
  const uint64_t exits = analysis == Analysis::kReport          ? diagnosis.exits
                         : analysis == Analysis::kAggregateOnly ? agg.analysis().exits_seen
                                                                : counter.exits;
  if (exits == 0) Die("the report counted no exits");
  *records = (*in)->records_read();
  *used = (*in)->read_threads();
  if ((*in)->segments() > 0) {
    LastSegments = fmt::format("; {} segments, {} read by a thread and taken", (*in)->segments(),
                               (*in)->verified_segments());
  }
  ::unsetenv("EXITSCOPE_DAT_THREADS");
  ::unsetenv("EXITSCOPE_DAT_SEGMENT_CHUNKS");
  ::unsetenv("EXITSCOPE_DAT_FAST");
  return t;
}

// --tile: a capture made of a real capture's CPU data repeated.

std::string TempDir;  // the --tile work directory when not --keep: removed at exit
void RemoveTempDir() {
  std::error_code ec;
  if (!TempDir.empty()) fs::remove_all(TempDir, ec);
}

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A little-endian reader of a version 6 file's metadata (the layout tracecmd_dat_layout.cc
// parses), only to find where the flyrecord CPU table is.
struct V6Cursor {
  std::string_view f;
  uint64_t pos = 0;
  bool ok = true;
  uint64_t U(int n) {
    uint64_t v = 0;
    if (!ok || f.size() - pos < static_cast<uint64_t>(n)) {
      ok = false;
      return 0;
    }
    std::memcpy(&v, f.data() + pos, n);
    pos += n;
    return v;
  }
  void Skip(uint64_t n) {
    if (!ok || f.size() - pos < n) ok = false;
    if (ok) pos += n;
  }
  void Str() {
    const size_t end = ok ? f.find('\0', pos) : std::string_view::npos;
    if (end == std::string_view::npos) ok = false;
    if (ok) pos = end + 1;
  }
  bool Tag(std::string_view tag) {  // tag + NUL
    if (!ok || f.size() - pos < tag.size() + 1 || f.substr(pos, tag.size()) != tag ||
        f[pos + tag.size()] != '\0') {
      return ok = false;
    }
    pos += tag.size() + 1;
    return true;
  }
};

// The version 6 file `f` (as `trace-cmd convert --file-version 6` writes it: one flat
// layout, uncompressed): the offset of its flyrecord CPU table (after the options), the CPU
// count and the page size. Dies on anything else (big-endian, 4-byte longs, instances).
uint64_t V6CpuTable(std::string_view f, uint32_t* cpus, uint32_t* page_size) {
  V6Cursor b{f, 10};  // the magic "\x17\x08\x44tracing"
  const auto fail = [&](const char* what) {
    Die(fmt::format("tile: version 6 file: {} (offset {})", what, b.pos));
  };
  if (f.size() < 12 || f.substr(b.pos, 2) != std::string_view("6\0", 2)) fail("not version 6");
  b.Str();
  if (b.U(1) != 0 || b.U(1) != 8) fail("big-endian or 4-byte longs: not tiled");
  *page_size = static_cast<uint32_t>(b.U(4));
  if (!b.Tag("header_page")) fail("no header_page");
  b.Skip(b.U(8));
  if (!b.Tag("header_event")) fail("no header_event");
  b.Skip(b.U(8));
  for (uint64_t n = b.U(4), i = 0; b.ok && i < n; ++i) b.Skip(b.U(8));  // ftrace formats
  for (uint64_t systems = b.U(4), s = 0; b.ok && s < systems; ++s) {    // event formats
    b.Str();
    for (uint64_t n = b.U(4), i = 0; b.ok && i < n; ++i) b.Skip(b.U(8));
  }
  b.Skip(b.U(4));  // kallsyms
  b.Skip(b.U(4));  // printk formats
  b.Skip(b.U(8));  // saved cmdlines
  *cpus = static_cast<uint32_t>(b.U(4));
  while (b.ok) {
    if (b.Tag("flyrecord")) break;
    b.ok = true;
    if (!b.Tag("options  ")) fail("expected options or flyrecord section");
    for (uint64_t id = b.U(2); b.ok && id != 0; id = b.U(2)) {
      if (id == 3) fail("a BUFFER option (instances): not tiled");
      b.Skip(b.U(4));
    }
  }
  if (!b.ok || f.size() - b.pos < uint64_t{*cpus} * 16) fail("truncated before the CPU table");
  if (*page_size < 64 || (*page_size & (*page_size - 1)) != 0) fail("page size");
  return b.pos;
}

struct Tiled {
  std::string path;
  uint64_t records = 0;  // as the pages hold them: the original's times `times`
};

// Builds in `dir` a version 7 zstd capture made of `source`'s CPU data repeated `times` times,
// each CPU's pages on the same CPU, byte for byte but for the page header's timestamp, shifted
// by k * (span + gap) for repetition k; the metadata (header_page, every event format, clock,
// options) is the source's own. Through trace-cmd: `convert --file-version 6` (one flat
// uncompressed layout), this tiling of the v6 file, then `convert --file-version 7
// --compression zstd` (chunks as trace-cmd writes them).
Tiled Tile(const std::string& source, int times, const std::string& dir) {
  const std::string v6 = dir + "/source-v6.dat", tiled6 = dir + "/tiled-v6.dat";
  Tiled out{dir + "/tiled.dat"};
  if (TimeCommand(fmt::format("trace-cmd convert -i '{}' --file-version 6 -o '{}'", source, v6)) <
      0) {
    Die("tile: trace-cmd convert --file-version 6 of " + source + " failed");
  }
  const std::string f = ReadWhole(v6);
  uint32_t cpus = 0, page = 0;
  const uint64_t table = V6CpuTable(f, &cpus, &page);
  std::vector<std::string_view> cpu(cpus);  // each CPU's pages in `f`
  V6Cursor t{f, table};
  uint64_t first = UINT64_MAX, last = 0, records = 0;
  std::vector<exitscope::sources::RingEvent> events;
  for (uint32_t c = 0; c < cpus; ++c) {
    const uint64_t off = t.U(8), size = t.U(8);
    if (off > f.size() || size > f.size() - off || size % page != 0) {
      Die(fmt::format("tile: CPU {} data [{}, +{}) outside the file or not whole pages", c, off,
                      size));
    }
    cpu[c] = std::string_view(f).substr(off, size);
    for (uint64_t p = 0; p < size; p += page) {
      const auto* pg = reinterpret_cast<const uint8_t*>(f.data() + off + p);
      if (!exitscope::sources::WalkRingPageFast(pg, page, &events)) {
        Die(
            fmt::format("tile: CPU {} page at offset {}: not walked (long records or absolute "
                        "time stamps): its last timestamp is unknown, not tiled",
                        c, off + p));
      }
      uint64_t ts = 0;
      std::memcpy(&ts, pg, 8);
      first = std::min(first, ts);
      last = std::max(last, ts);
      for (const auto& e : events) last = std::max(last, e.ts);
      records += events.size();
    }
  }
  if (records == 0) Die("tile: " + source + " holds no records");
  const uint64_t span = last - first;
  const uint64_t shift = span + std::max<uint64_t>(span / 100, 1);  // the gap: 1% of the span
  if (shift > (UINT64_MAX - last) / static_cast<uint64_t>(times)) {
    Die("tile: the shifted timestamps would overflow 64 bits");
  }
  // The v6 file: its metadata as it is, a new CPU table, each CPU's pages `times` times.
  std::string head = f.substr(0, table);
  const uint64_t data_at = (table + uint64_t{cpus} * 16 + page - 1) / page * page;
  uint64_t at = data_at;
  for (std::string_view c : cpu) {
    const uint64_t size = c.size() * static_cast<uint64_t>(times);
    head.append(reinterpret_cast<const char*>(&at), 8);
    head.append(reinterpret_cast<const char*>(&size), 8);
    at += size;
  }
  head.resize(data_at, '\0');
  std::ofstream o(tiled6, std::ios::binary);
  o.write(head.data(), static_cast<std::streamsize>(head.size()));
  std::string pages;
  for (std::string_view c : cpu) {
    for (int k = 0; k < times; ++k) {
      pages.assign(c);
      for (size_t p = 0; p < pages.size(); p += page) {
        uint64_t ts = 0;
        std::memcpy(&ts, pages.data() + p, 8);
        ts += static_cast<uint64_t>(k) * shift;
        std::memcpy(pages.data() + p, &ts, 8);
      }
      o.write(pages.data(), static_cast<std::streamsize>(pages.size()));
    }
  }
  o.close();
  if (!o) Die("tile: cannot write " + tiled6);
  if (TimeCommand(fmt::format("trace-cmd convert -i '{}' --file-version 7 --compression zstd -o "
                              "'{}'",
                              tiled6, out.path)) < 0) {
    Die("tile: trace-cmd convert --file-version 7 --compression zstd of " + tiled6 + " failed");
  }
  out.records = records * static_cast<uint64_t>(times);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string capture, record_dir, keep_dir;
  uint64_t iterations = 60000;
  int runs = 3, tile = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--record") && i + 1 < argc) {
      record_dir = argv[++i];
    } else if (!std::strcmp(argv[i], "--tile") && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      tile = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--keep") && i + 1 < argc) {
      keep_dir = argv[++i];
    } else if (!std::strcmp(argv[i], "--iterations") && i + 1 < argc) {
      iterations = std::strtoull(argv[++i], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (argv[i][0] != '-' && capture.empty()) {
      capture = argv[i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [CAPTURE.dat] [--record DIR [--iterations N]] [--tile N [--keep "
                   "DIR]] [--runs N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (tile > 0 && !record_dir.empty()) {
    std::fprintf(stderr, "kvm_dat_floor_benchmark: --tile and --record exclude each other\n");
    return 2;
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
  uint64_t tiled_records = 0;
  if (tile > 0) {
    if (!Have("trace-cmd")) {
      std::printf(
          "trace-cmd: not installed, --tile cannot build its capture (it converts "
          "with trace-cmd): nothing measured\n");
      return 0;
    }
    const fs::path src_dir(EXITSCOPE_SOURCE_DIR);
    const std::string source =
        capture.empty() ? (src_dir / "testdata/kvm/pvm-user64-pio-mmio-hlt.dat").string() : capture;
    std::string dir = keep_dir;
    if (dir.empty()) {
      std::string tmpl = (fs::temp_directory_path() / "kvm-dat-tile-XXXXXX").string();
      if (!::mkdtemp(tmpl.data())) Die("cannot make a temporary directory");
      dir = TempDir = tmpl;
      std::atexit(RemoveTempDir);
    } else {
      fs::create_directories(dir);
    }
    const Tiled t = Tile(source, tile, dir);
    capture = t.path;
    tiled_records = t.records;
    auto d = exitscope::sources::TraceCmdDat::Open(capture);
    if (!d) Die(d.error().message);
    const std::string rel = fs::path(source).lexically_proximate(src_dir).string();
    std::printf(
        "tiled capture: %s's CPU data repeated %d times (real records and formats, "
        "timestamps shifted; derived data, not a new recording): %llu records, %.2f MB, "
        "v%d %s%s\n",
        rel.starts_with("..") ? source.c_str() : rel.c_str(), tile,
        static_cast<unsigned long long>(t.records),
        static_cast<double>(fs::file_size(capture)) / 1e6, (*d)->version(),
        (*d)->compression().c_str(), keep_dir.empty() ? "" : (", kept: " + capture).c_str());
  }
  if (capture.empty()) capture = LargestCommittedDat();
  if (capture.empty()) Die("no capture given and no .dat under testdata/");

  auto dat = exitscope::sources::TraceCmdDat::Open(capture);
  if (!dat) Die(dat.error().message);
  std::printf("capture %s: trace-cmd .dat v%d, %s, %.2f MB, %d CPUs, %u cores here\n",
              capture.c_str(), (*dat)->version(), (*dat)->compression().c_str(),
              static_cast<double>(fs::file_size(capture)) / 1e6, (*dat)->cpus(),
              std::thread::hardware_concurrency());

  // The rows are measured in rounds, each round running every row once, and each row keeps
  // its best round: a slow spell of this shared host then costs every row a round, not one
  // row all its runs (which made the ratios swing by 50 % here).
  uint64_t pages = 0, sum = 0;
  uint64_t records = 0;
  int used = 0, forced_used = 0;
  uint64_t f_floor = 0, f_one = 0, f_auto = 0, f_forced = 0;  // page faults, last round
  std::string auto_segments;  // the default row's segments, last round
  double t_open = 1e300, t_floor = 1e300, t_one = 1e300, t_checked = 1e300, t_auto = 1e300,
         t_forced = 1e300, t_agg = 1e300, t_pair = 1e300;
  for (int round = 0; round < runs; ++round) {
    auto t0 = Clock::now();
    auto d = exitscope::sources::KvmInput::Open(capture, {});
    if (!d) Die(d.error().message);
    t_open = std::min(t_open, Seconds(t0, Clock::now()));
    const uint64_t f0 = MinorFaults();
    t0 = Clock::now();
    if (auto s = (*dat)->LoadPagesOnly(&pages, &sum); !s) Die(s.error().message);
    t_floor = std::min(t_floor, Seconds(t0, Clock::now()));
    f_floor = MinorFaults() - f0;
    t_one = std::min(t_one, Report(capture, 1, true, &records, &used, &f_one));
    t_checked = std::min(t_checked, Report(capture, 1, false, &records, &used));
    LastSegments.clear();
    t_auto = std::min(t_auto, Report(capture, 0, true, &records, &used, &f_auto));
    auto_segments = LastSegments;  // the rows below read in segments too
    t_forced =
        std::min(t_forced, Report(capture, 2, true, &records, &forced_used, &f_forced, false));
    t_agg = std::min(
        t_agg, Report(capture, 0, true, &records, &used, nullptr, true, Analysis::kAggregateOnly));
    t_pair =
        std::min(t_pair, Report(capture, 0, true, &records, &used, nullptr, true, Analysis::kNone));
  }
  const auto row = [&](const char* what, double t, const std::string& note) {
    std::printf("%-34s %9.4f s %12.0f events/s %6.2fx floor  %s\n", what, t,
                static_cast<double>(records) / t, t / t_floor, note.c_str());
  };
  std::printf("%llu records, %llu pages (checksum %llx)\n",
              static_cast<unsigned long long>(records), static_cast<unsigned long long>(pages),
              static_cast<unsigned long long>(sum));
  row("open (layout, formats in a child)", t_open, "KvmInput::Open, not in the rows below");
  row("floor: load pages (decompress)", t_floor,
      fmt::format("one thread; {} page faults", f_floor));
  row("report, fast path, 1 thread", t_one,
      fmt::format("in process: read, decode, pair, aggregate, diagnose; {} page faults", f_one));
  row("report, checked path, 1 thread", t_checked, "every page through kbuffer");
  row("report, fast path, default", t_auto,
      fmt::format("{} reading thread(s); {} page faults{}", used, f_auto, auto_segments));
  row("report, decompressing threads", t_forced,
      fmt::format("{} reading thread(s): one per compressed CPU stream, no segments; {} page "
                  "faults",
                  forced_used, f_forced));
  row("  default, aggregator only", t_agg, "the same read, no diagnosis on the tee");
  row("  default, no analysis", t_pair, "read, decode, pair; each exit only counted");

  // The two whole processes in rounds too (see above).
  const bool have_cli = fs::exists(cli), have_tc = Have("trace-cmd");
  double t_cli = have_cli ? 1e300 : -1, t_tc = have_tc ? 1e300 : -1;
  for (int round = 0; round < runs; ++round) {
    if (have_cli && t_cli > 0) {
      const double t =
          TimeCommand(fmt::format("'{}' kvm report -i '{}' --percentiles", cli, capture));
      t_cli = t < 0 ? -1 : std::min(t_cli, t);
    }
    if (have_tc && t_tc > 0) {
      const double t = TimeCommand(fmt::format("trace-cmd report '{}'", capture));
      t_tc = t < 0 ? -1 : std::min(t_tc, t);
    }
  }
  if (!have_cli) {
    std::printf("exitscope binary not built at %s: CLI row left out\n", cli.c_str());
  } else if (t_cli > 0) {
    row("exitscope kvm report -i FILE", t_cli, "the binary, output discarded");
  }
  if (!have_tc) {
    std::printf("trace-cmd: not installed, row left out\n");
  } else if (t_tc > 0) {
    row("trace-cmd report FILE", t_tc, "output discarded");
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
  std::printf(
      "ratio report/floor (in process, after open): %.2f with 1 thread, %.2f default, %.2f "
      "with decompressing threads\n",
      t_one / t_floor, t_auto / t_floor, t_forced / t_floor);
  std::printf(
      "where the default's time goes (x floor): reading and pairing %.2f, the aggregator "
      "%+.2f, the diagnosis %+.2f\n",
      t_pair / t_floor, (t_agg - t_pair) / t_floor, (t_auto - t_agg) / t_floor);
  std::printf("ratio fast path/checked path, 1 thread: %.2fx faster\n", t_checked / t_one);
  if (t_tc > 0 && t_cli > 0) {
    std::printf("ratio trace-cmd report/exitscope kvm report (whole processes): %.1fx\n",
                t_tc / t_cli);
  }
  if (tile > 0 && records != tiled_records) {
    std::printf("tiled capture: %llu records read, %llu in its pages: MISMATCH\n",
                static_cast<unsigned long long>(records),
                static_cast<unsigned long long>(tiled_records));
    return 1;
  }
  if (records < 1'000'000) {
    std::printf(
        "note: %llu records, under the 1 M of issue 27's target: figures of a small "
        "capture (open and process start weigh more)\n",
        static_cast<unsigned long long>(records));
  }
  return 0;
}
