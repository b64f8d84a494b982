// timeline_benchmark: the size and time of `exitscope timeline` for a big dump (issue 9).
//
//   build/bench/timeline_benchmark [--exits N] [--vcpus N] [--out PATH] [--max-exits N] [--keep]
//
// Builds a synthetic dump with the recorder library: --vcpus rings of N / vcpus records, each
// filled by BeginExit / EndExit of MMIO exits on an NVMe BAR's doorbells and PIO exits on a
// UART, round robin (real TSC times: each exit as long as the recorder's own hot path), plus
// one I/O submit and complete per 64 exits; takes a Snapshot, writes it with WriteDumpFile,
// reads it back with ReadDump (as the CLI does) and renders the timeline with
// report::WriteTimeline into --out (default /tmp/timeline_benchmark.json; removed after, with
// the dump PATH.esdump, unless --keep: then `exitscope timeline PATH.esdump` can be timed). It
// prints the time of each step, the file's bytes and bytes per exit, and the process's peak
// RSS before and after rendering (the writer streams: rendering adds no memory per exit).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "exitscope/dump.h"
#include "exitscope/recorder.h"
#include "report/timeline.h"

namespace {

using namespace exitscope;

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

long PeakRssMb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr, "timeline_benchmark: %s (see --help)\n", msg);
  std::exit(2);
}

uint64_t Count(const char* flag, const char* text, uint64_t min, uint64_t max) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (text[0] == '\0' || text[0] == '-' || *end != '\0' || v < min || v > max) {
    Usage((std::string(flag) + ": '" + text + "' is not a whole number in [" + std::to_string(min) +
           ", " + std::to_string(max) + "]")
              .c_str());
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t exits = 1'000'000, vcpus = 4, max_exits = 0;
  bool keep = false;
  std::string out = "/tmp/timeline_benchmark.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) Usage((a + ": needs a value").c_str());
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: timeline_benchmark [--exits N] [--vcpus N] [--out PATH] [--max-exits N] "
          "[--keep]\n"
          "  Records N exits (default 1000000) over --vcpus (default 4) with the recorder,\n"
          "  dumps them, and renders the timeline (report::WriteTimeline); prints the time,\n"
          "  bytes, bytes per exit and peak RSS. --max-exits as exitscope timeline's (default\n"
          "  0: all). --keep leaves PATH and PATH.esdump. Exit status: 0 ok, 1 a failure,\n"
          "  2 bad usage.\n");
      return 0;
    } else if (a == "--exits") {
      exits = Count("--exits", next(), 1, 1ull << 26);
    } else if (a == "--vcpus") {
      vcpus = Count("--vcpus", next(), 1, 256);
    } else if (a == "--out") {
      out = next();
    } else if (a == "--keep") {
      keep = true;
    } else if (a == "--max-exits") {
      max_exits = Count("--max-exits", next(), 0, 1ull << 40);
    } else {
      Usage(("unknown flag '" + a + "'").c_str());
    }
  }
  const uint64_t per_vcpu = (exits + vcpus - 1) / vcpus;
  RecorderOptions ro;
  ro.num_vcpus = static_cast<uint32_t>(vcpus);
  ro.events_per_vcpu = per_vcpu;  // rounded up to a power of two: nothing is overwritten
  ro.device_events = 1u << 16;
  ro.slow_exit.threshold_ns = 60'000'000'000ull;
  ro.watchdog.stuck_exit_ns = 60'000'000'000ull;
  auto created = Recorder::Create(ro);
  if (!created) {
    std::fprintf(stderr, "timeline_benchmark: %s\n", created.error().message.c_str());
    return 1;
  }
  Recorder& rec = **created;
  const uint32_t nvme = *rec.address_space().AddDevice({.name = "nvme0", .kind = "nvme"});
  (void)rec.address_space().AddRange(IoSpace::kMmio, 0xfebf0000, 0x4000, nvme,
                                     *RegisterMap::Builtin("nvme"));
  const uint32_t uart = *rec.address_space().AddDevice({.name = "uart0", .kind = "uart16550"});
  (void)rec.address_space().AddRange(IoSpace::kPio, 0x3f8, 8, uart,
                                     *RegisterMap::Builtin("uart16550"));

  const double t0 = NowMs();
  uint64_t recorded = 0, io = 0;
  for (uint64_t k = 0; k < per_vcpu && recorded < exits; ++k) {
    for (uint32_t v = 0; v < vcpus && recorded < exits; ++v, ++recorded) {
      if (recorded % 3 == 2) {
        rec.BeginExit(v, ExitKind::kPio, 0x3fd, 1, AccessDir::kRead);
      } else {
        rec.BeginExit(v, ExitKind::kMmio, 0xfebf1008 + 8 * (recorded % 2), 4, AccessDir::kWrite);
      }
      rec.EndExit(v);
      if (recorded % 64 == 0) rec.IoSubmit(nvme, ++io);
      if (recorded % 64 == 32) rec.IoComplete(nvme, io, 0);
    }
  }
  const double t1 = NowMs();
  const std::string dump_path = out + ".esdump";
  if (Status s = rec.WriteDump(dump_path); !s) {
    std::fprintf(stderr, "timeline_benchmark: %s\n", s.error().message.c_str());
    return 1;
  }
  const double t2 = NowMs();
  auto dump = ReadDump(dump_path);
  if (!keep) std::remove(dump_path.c_str());
  if (!dump) {
    std::fprintf(stderr, "timeline_benchmark: %s\n", dump.error().message.c_str());
    return 1;
  }
  uint64_t in_dump = 0;
  for (const DumpVcpu& v : dump->vcpus) in_dump += v.exits.size();
  const double t3 = NowMs();
  const long rss_before = PeakRssMb();

  report::TimelineInputs in;
  in.dump = &*dump;
  in.dump_path = dump_path;
  report::TimelineOptions o;
  o.max_exits = max_exits;
  const double t4 = NowMs();
  auto st = report::WriteTimeline(in, o, out);
  const double t5 = NowMs();
  if (!st) {
    std::fprintf(stderr, "timeline_benchmark: %s\n", st.error().message.c_str());
    return 1;
  }
  if (!keep) std::remove(out.c_str());
  const long rss_after = PeakRssMb();
  std::printf(
      "timeline_benchmark: %llu exits recorded on %llu vCPUs (%.0f ms), %llu in the dump "
      "(write %.0f ms, read %.0f ms), %llu I/Os\n",
      static_cast<unsigned long long>(recorded), static_cast<unsigned long long>(vcpus), t1 - t0,
      static_cast<unsigned long long>(in_dump), t2 - t1, t3 - t2,
      static_cast<unsigned long long>(io));
  std::printf(
      "timeline %llu exits: %.0f ms, %llu bytes (%.1f MB), %.1f bytes/exit, %llu exit "
      "slices, %llu I/O slices, %llu left out by --max-exits\n",
      static_cast<unsigned long long>(in_dump), t5 - t4, static_cast<unsigned long long>(st->bytes),
      static_cast<double>(st->bytes) / 1e6,
      static_cast<double>(st->bytes) / static_cast<double>(in_dump ? in_dump : 1),
      static_cast<unsigned long long>(st->vmm_exits),
      static_cast<unsigned long long>(st->io_slices), static_cast<unsigned long long>(st->capped));
  std::printf("peak RSS: %ld MB with the dump read, %ld MB after rendering\n", rss_before,
              rss_after);
  return 0;
}
