// recorder_scale: the recorder at the scale of a big guest (issue 12, part 5): 256 vCPU rings x
// 65536 records, writers on every core at full speed while one reader dumps.
//
//   build/bench/recorder_scale [--vcpus N] [--records N] [--writers N] [--dumps N]
//                              [--compare N] [--threads N] [--file PATH]
//
// Writer thread w drives vCPUs w, w + W, w + 2W, ... (one thread per vCPU index, as the
// recorder requires) with BeginExit/EndExit of MMIO and PIO exits on 64 NVMe BARs and a UART,
// round robin, never waiting. The rings are filled once before the first dump. Then the reader
// takes --dumps dumps with Recorder::WriteDump (the path WriteDump, es_write_dump and the dump
// signal use: rings streamed to the file, on --threads coding threads, default WriteDump's
// own choice), each timed on the wall clock, on the CPU clocks of all the dump's threads (the
// process's minus the writers') and of the calling thread (on a machine with fewer cores than
// writers + threads the dump is time-sliced with the writers), then one dump on a single
// coding thread for the ratio, and reads every file back with ReadDump for the accounting. In
// the same run, for ratios: --compare dumps the old way (Recorder::Snapshot into a fresh Dump +
// SerializeDump into a fresh string, in memory: what WriteDump did before), and the floors of
// this machine: pwrite of as many bytes from one cached block to a new file in the same
// directory, memcpy of as many bytes into fresh and into mapped memory, and the ring read
// alone (every record copied out of its seqlock slot on the dump's number of threads, no
// conversion, coding or file: what any dump must do first). It prints:
//
//   records recorded per second (all writers, without a reader and while dumping);
//   per dump: ms (wall, reader CPU, system, page faults), bytes;
//   dump 256 vCPUs x 65536 records: T ms, B bytes   (T: median WriteDump, wall clock)
//   the accounting of every dump, read from its file: written = read + overwritten + skipped,
//   exactly, where written and overwritten are the dump's per-vCPU counters (the ring head
//   the dump copied up to), read the records it holds and skipped those this dump found torn
//   or overwritten while copying. Exit status 1 if the identity fails for any dump or a dump
//   fails, 2 on a bad flag.
//
// --file defaults to /dev/shm (tmpfs): the dump's cost without the disk's (a dump to disk is
// the same work plus the device's write-back, which fsync waits for: give --file on disk to
// see it).
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "exitscope/recorder.h"

// GCC 12 flags free() in a replaced operator delete as mismatched with new: the pair below
// is consistent (both malloc/free), so silence that false positive here.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
thread_local uint64_t g_allocs = 0;
}  // namespace

void* operator new(std::size_t n) {
  ++g_allocs;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  ++g_allocs;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}

namespace {

using namespace exitscope;

struct Options {
  uint32_t vcpus = 256;
  uint64_t records = 65536;
  uint32_t writers = 0;  // 0: one per online CPU
  int dumps = 4;
  int compare = 1;
  uint32_t threads = 0;  // DumpOptions::threads (0: WriteDump's choice)
  std::string file;      // default: /dev/shm/recorder_scale-<pid>.esdump
};

constexpr uint64_t kBase = 0xc0000000;
constexpr uint64_t kBar = 0x4000;
constexpr int kNvme = 64;
constexpr uint64_t kUartPort = 0x3f8;

double WallMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// The reader thread's minor page faults and system CPU time so far.
struct ThreadUsage {
  uint64_t minflt = 0;
  double sys_ms = 0;
};
ThreadUsage Usage() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return {static_cast<uint64_t>(ru.ru_minflt), static_cast<double>(ru.ru_stime.tv_sec) * 1e3 +
                                                   static_cast<double>(ru.ru_stime.tv_usec) / 1e3};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr, "recorder_scale: %s (see --help)\n", msg);
  std::exit(2);
}

uint64_t ParseCount(const char* flag, const char* text, uint64_t min, uint64_t max) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (text[0] == '\0' || text[0] == '-' || *end != '\0' || errno != 0 || v < min || v > max) {
    const std::string m = std::string(flag) + ": '" + text + "' is not a whole number in [" +
                          std::to_string(min) + ", " + std::to_string(max) + "]";
    Usage(m.c_str());
  }
  return v;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) Usage((a + ": needs a value").c_str());
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: recorder_scale [--vcpus N] [--records N] [--writers N] [--dumps N] "
          "[--compare N] [--threads N] [--file PATH]\n"
          "  Writers record exits on every vCPU ring at full speed while a reader takes\n"
          "  dumps (Recorder::WriteDump, read back with ReadDump); prints records/s, the time\n"
          "  and size of each dump, the accounting written = read + overwritten + skipped,\n"
          "  the old in-memory path and this machine's floors for comparison.\n"
          "  --vcpus N     vCPU rings (default 256, 1..4096)\n"
          "  --records N   records per ring (default 65536, 2..16777216; a power of two)\n"
          "  --writers N   writer threads (default: one per online CPU)\n"
          "  --dumps N     WriteDump dumps while the writers run (default 4)\n"
          "  --compare N   dumps the old way (Snapshot + SerializeDump, in memory; default 1)\n"
          "  --threads N   WriteDump's coding threads (DumpOptions::threads; default 0, its\n"
          "                own choice); one more dump on 1 thread is timed for the ratio\n"
          "  --file PATH   the dump file (default /dev/shm/recorder_scale-PID.esdump, removed\n"
          "                at the end); its directory gets the floor's file too\n"
          "Exit status: 0 ok, 1 the accounting failed, 2 bad usage.\n");
      std::exit(0);
    } else if (a == "--vcpus") {
      o.vcpus = static_cast<uint32_t>(ParseCount("--vcpus", next(), 1, 4096));
    } else if (a == "--records") {
      o.records = ParseCount("--records", next(), 2, 1u << 24);
      if ((o.records & (o.records - 1)) != 0) Usage("--records: must be a power of two");
    } else if (a == "--writers") {
      o.writers = static_cast<uint32_t>(ParseCount("--writers", next(), 1, 4096));
    } else if (a == "--dumps") {
      o.dumps = static_cast<int>(ParseCount("--dumps", next(), 1, 1000));
    } else if (a == "--compare") {
      o.compare = static_cast<int>(ParseCount("--compare", next(), 0, 1000));
    } else if (a == "--threads") {
      o.threads = static_cast<uint32_t>(ParseCount("--threads", next(), 0, 64));
    } else if (a == "--file") {
      o.file = next();
      if (o.file.empty()) Usage("--file: empty path");
    } else {
      Usage(("unknown flag '" + a + "'").c_str());
    }
  }
  if (o.writers == 0) o.writers = std::max(1u, std::thread::hardware_concurrency());
  o.writers = std::min(o.writers, o.vcpus);
  if (o.file.empty()) o.file = "/dev/shm/recorder_scale-" + std::to_string(getpid()) + ".esdump";
  return o;
}

// 64 NVMe controllers (16 KiB BAR each, with the nvme register map) and a UART on PIO.
void AddDevices(Recorder& r) {
  auto nvme = *RegisterMap::Builtin("nvme");
  for (int i = 0; i < kNvme; ++i) {
    const uint32_t d =
        *r.address_space().AddDevice({.name = "nvme" + std::to_string(i), .kind = "nvme"});
    (void)r.address_space().AddRange(IoSpace::kMmio, kBase + kBar * 2 * i, kBar, d, nvme);
  }
  const uint32_t uart = *r.address_space().AddDevice({.name = "uart0", .kind = "uart16550"});
  (void)r.address_space().AddRange(IoSpace::kPio, kUartPort, 8, uart,
                                   *RegisterMap::Builtin("uart16550"));
}

struct Counts {
  uint64_t read = 0, written = 0, overwritten = 0, skipped = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseArgs(argc, argv);
  RecorderOptions ro;
  ro.num_vcpus = o.vcpus;
  ro.events_per_vcpu = o.records;
  // A writer preempted on a loaded machine must not take the (allocating, logging) slow path,
  // nor the watchdog report it stuck: this measures the ring, not the findings.
  ro.slow_exit.threshold_ns = 60'000'000'000ull;
  ro.watchdog.stuck_exit_ns = 60'000'000'000ull;
  auto created = Recorder::Create(ro);
  if (!created) {
    std::fprintf(stderr, "recorder_scale: %s\n", created.error().message.c_str());
    return 1;
  }
  Recorder& rec = **created;
  AddDevices(rec);

  // Doorbells and registers across all BARs, and UART registers, in a fixed shuffled order.
  std::vector<uint64_t> addrs;
  static const uint64_t kOffsets[] = {0x1000, 0x1004, 0x1008, 0x100c, 0x1010, 0x14, 0x1c};
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 4096; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    addrs.push_back(kBase + kBar * 2 * (x % kNvme) + kOffsets[(x >> 20) % 7]);
  }

  std::atomic<bool> stop{false};
  std::vector<std::atomic<uint64_t>> done(o.writers);
  std::vector<std::thread> writers;
  for (uint32_t w = 0; w < o.writers; ++w) {
    writers.emplace_back([&, w] {
      uint64_t n = 0, i = w * 977;
      for (uint64_t round = 0; !stop.load(std::memory_order_relaxed); ++round) {
        for (uint32_t v = w; v < o.vcpus; v += o.writers) {
          const uint64_t a = addrs[i++ & 4095];
          if ((i & 15) == 0) {
            rec.BeginExit(v, ExitKind::kPio, kUartPort + (i & 7), 1, AccessDir::kRead);
            rec.EndExit(v, i & 0xff);
          } else {
            rec.BeginExit(v, ExitKind::kMmio, a, 4, AccessDir::kWrite, i);
            rec.EndExit(v);
          }
          ++n;
        }
        if ((round & 63) == 0) done[w].store(n, std::memory_order_relaxed);
      }
      done[w].store(n, std::memory_order_relaxed);
    });
  }
  auto total_done = [&] {
    uint64_t t = 0;
    for (auto& d : done) t += d.load(std::memory_order_relaxed);
    return t;
  };

  // Fill every ring once (records/s without a reader), then dump while the writers run.
  const double fill0 = WallMs();
  // Every ring full: writer w drives ceil((vcpus - w) / writers) vCPUs.
  auto all_full = [&] {
    for (uint32_t w = 0; w < o.writers; ++w) {
      const uint64_t mine = (o.vcpus - w + o.writers - 1) / o.writers;
      if (done[w].load(std::memory_order_relaxed) < mine * o.records) return false;
    }
    return true;
  };
  while (!all_full()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const double fill_ms = WallMs() - fill0;
  const uint64_t filled = total_done();

  std::printf("recorder_scale: %u vCPUs x %llu records, %u writer thread(s), %u online CPU(s)\n",
              o.vcpus, static_cast<unsigned long long>(o.records), o.writers,
              std::thread::hardware_concurrency());
  std::printf("records recorded per second (writers alone): %.1f M/s (%llu records in %.0f ms)\n",
              static_cast<double>(filled) / fill_ms / 1e3, static_cast<unsigned long long>(filled),
              fill_ms);

  // The CPU of a dump: the reader thread's, and that of all the threads the dump ran (the
  // process's CPU minus the writers', so a helper thread of WriteDump is counted too).
  std::vector<clockid_t> writer_clocks;
  for (auto& t : writers) {
    clockid_t c;
    if (pthread_getcpuclockid(t.native_handle(), &c) == 0) writer_clocks.push_back(c);
  }
  auto cpu_ms = [](clockid_t c) {
    timespec ts{};
    clock_gettime(c, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
  };
  auto dump_threads_cpu = [&] {
    double v = cpu_ms(CLOCK_PROCESS_CPUTIME_ID);
    if (!stop.load()) {
      for (clockid_t c : writer_clocks) v -= cpu_ms(c);
    }
    return v;
  };
  struct Timed {
    double wall = 0, cpu = 0, all_cpu = 0, sys = 0;
    uint64_t faults = 0;
  };
  auto timed = [&](auto&& fn) {
    const ThreadUsage u0 = Usage();
    const double c0 = ThreadCpuMs();
    const double a0 = dump_threads_cpu();
    const double t0 = WallMs();
    fn();
    Timed t;
    t.wall = WallMs() - t0;
    t.cpu = ThreadCpuMs() - c0;
    t.all_cpu = dump_threads_cpu() - a0;
    const ThreadUsage u1 = Usage();
    t.sys = u1.sys_ms - u0.sys_ms;
    t.faults = u1.minflt - u0.minflt;
    return t;
  };
  auto show = [](const Timed& t) {
    return std::to_string(static_cast<long long>(t.wall)) + " ms wall (CPU " +
           std::to_string(static_cast<long long>(t.all_cpu)) + " ms in all its threads; reader " +
           std::to_string(static_cast<long long>(t.cpu)) + " ms, of which system " +
           std::to_string(static_cast<long long>(t.sys)) + " ms; " + std::to_string(t.faults) +
           " page faults)";
  };

  std::vector<double> walls, cpus;
  std::vector<uint64_t> prev_skipped(o.vcpus, 0);
  bool identity_ok = true;
  uint64_t bytes = 0;
  double last_wall = 0;
  // The accounting of one dump, from what ReadDump gives back.
  auto account = [&](const Dump& d, const char* what) {
    Counts c;
    for (const DumpVcpu& v : d.vcpus) {
      c.read += v.exits.size();
      c.written += v.counters.written;
      c.overwritten += v.counters.overwritten;
      c.skipped += v.counters.skipped - prev_skipped[v.vcpu];
      prev_skipped[v.vcpu] = v.counters.skipped;
    }
    const bool ok = c.written == c.read + c.overwritten + c.skipped;
    identity_ok = identity_ok && ok;
    std::printf(
        "  accounting (%s): written %llu %s read %llu + overwritten %llu + skipped %llu%s\n", what,
        static_cast<unsigned long long>(c.written),
        ok ? "=" : "!=", static_cast<unsigned long long>(c.read),
        static_cast<unsigned long long>(c.overwritten), static_cast<unsigned long long>(c.skipped),
        ok ? "" : "  MISMATCH");
  };
  auto write_dump = [&](const char* label, uint32_t threads) -> bool {
    Status st;
    const Timed t = timed([&] { st = rec.WriteDump(o.file, {.threads = threads}); });
    if (!st) {
      std::fprintf(stderr, "recorder_scale: %s\n", st.error().message.c_str());
      return false;
    }
    Result<Dump> back = ReadDump(o.file);
    if (!back) {
      std::fprintf(stderr, "recorder_scale: reading the dump back: %s\n",
                   back.error().message.c_str());
      return false;
    }
    struct stat sb {};
    stat(o.file.c_str(), &sb);
    bytes = static_cast<uint64_t>(sb.st_size);
    std::printf("%s: WriteDump %s, %llu bytes\n", label, show(t).c_str(),
                static_cast<unsigned long long>(bytes));
    account(*back, "from the file");
    last_wall = t.wall;
    if (std::string(label).starts_with("dump ")) {
      walls.push_back(t.wall);
      cpus.push_back(t.all_cpu);
    }
    return true;
  };

  const uint64_t during0 = total_done();
  const double during_t0 = WallMs();
  for (int k = 0; k < o.dumps; ++k) {
    if (!write_dump(("dump " + std::to_string(k + 1)).c_str(), o.threads)) return 1;
  }
  // The same on one coding thread, for the ratio.
  if (!write_dump("one coding thread", 1)) return 1;
  const double one_thread_ms = last_wall;
  // The old way, in the same run: a fresh Dump and a fresh string (what WriteDump did).
  std::vector<double> old_walls, old_cpus;
  for (int k = 0; k < o.compare; ++k) {
    Dump d;
    std::string b;
    const uint64_t a0 = g_allocs;
    const Timed t = timed([&] {
      d = rec.Snapshot();
      b = SerializeDump(d);
    });
    old_walls.push_back(t.wall);
    old_cpus.push_back(t.all_cpu);
    std::printf(
        "old way %d (Snapshot + SerializeDump, fresh, in memory): %s, %zu bytes, %llu "
        "allocations\n",
        k + 1, show(t).c_str(), b.size(), static_cast<unsigned long long>(g_allocs - a0));
    account(d, "in memory");
  }
  // Floors of this machine for as many bytes, in the same conditions (writers running).
  {
    constexpr size_t kBlock = 120 * 1024;
    std::vector<char> block(kBlock, 'x');
    const std::string floor_path = o.file + ".floor";
    int fd = open(floor_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      const Timed t = timed([&] {
        for (uint64_t off = 0; off < bytes; off += kBlock) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlock, bytes - off));
          if (pwrite(fd, block.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
            break;
          }
        }
        (void)fsync(fd);
      });
      close(fd);
      unlink(floor_path.c_str());
      std::printf("floor: pwrite %llu bytes from one cached block to a new file there: %s\n",
                  static_cast<unsigned long long>(bytes), show(t).c_str());
    }
    std::unique_ptr<char[]> src(new char[bytes]);
    std::memset(src.get(), 1, bytes);
    std::unique_ptr<char[]> dst(new char[bytes]);
    const Timed fresh = timed([&] { std::memcpy(dst.get(), src.get(), bytes); });
    const Timed mapped = timed([&] { std::memcpy(dst.get(), src.get(), bytes); });
    std::printf("floor: memcpy %llu bytes into fresh memory: %s\n",
                static_cast<unsigned long long>(bytes), show(fresh).c_str());
    std::printf("floor: memcpy %llu bytes into mapped memory: %s\n",
                static_cast<unsigned long long>(bytes), show(mapped).c_str());
  }
  // The ring-read floor: every record of every ring copied out of its seqlock slot, what any
  // dump does before it can code or write anything, and nothing else; on as many threads as
  // WriteDump's automatic choice (or --threads), taking whole vCPUs in turn as it does.
  {
    const uint32_t n = o.threads != 0
                           ? o.threads
                           : std::clamp<uint32_t>(std::thread::hardware_concurrency(), 1, 8);
    std::atomic<uint32_t> next_vcpu{0};
    std::atomic<uint64_t> sink{0}, copied{0};
    const Timed t = timed([&] {
      std::vector<std::thread> readers;
      for (uint32_t k = 0; k < n; ++k) {
        readers.emplace_back([&] {
          constexpr size_t kChunk = 512;  // as the dump's chunk
          std::unique_ptr<ExitRecord[]> chunk(new ExitRecord[kChunk]);
          uint64_t acc = 0, got = 0;
          for (uint32_t v; (v = next_vcpu.fetch_add(1)) < o.vcpus;) {
            got += rec.flight_recorder()
                       .ring(v)
                       .SnapshotChunked(0, chunk.get(), kChunk,
                                        [&](const ExitRecord* r, size_t m) {
                                          for (size_t i = 0; i < m; ++i) acc += r[i].duration_ticks;
                                        })
                       .copied;
          }
          sink.fetch_add(acc);
          copied.fetch_add(got);
        });
      }
      for (auto& r : readers) r.join();
    });
    // Its torn records were added to the rings' skipped counters: not any dump's.
    for (uint32_t v = 0; v < o.vcpus; ++v) prev_skipped[v] = rec.ring_counters(v).skipped;
    std::printf("floor: read every ring record (seqlock copy only, %llu records, %u threads): %s\n",
                static_cast<unsigned long long>(copied.load()), n, show(t).c_str());
    (void)sink.load();
  }
  const double during_ms = WallMs() - during_t0;
  const uint64_t during = total_done() - during0;
  stop.store(true);
  for (auto& t : writers) t.join();

  // Two more with the writers stopped, on --threads and on one coding thread: the dump alone
  // (on a shared machine, still beside whatever else runs there).
  if (!write_dump("after the writers stopped", o.threads)) return 1;
  const double alone_ms = last_wall;
  if (!write_dump("after the writers stopped, one coding thread", 1)) return 1;
  const double alone_one_ms = last_wall;
  unlink(o.file.c_str());
  std::printf("records recorded per second (while dumping): %.1f M/s\n",
              static_cast<double>(during) / during_ms / 1e3);
  std::printf("WriteDump: median %.1f ms wall, CPU (all its threads) median %.1f ms\n",
              Median(walls), Median(cpus));
  std::printf(
      "one coding thread: %.1f ms wall while the writers ran (%.2fx the median), %.1f ms "
      "after (%.2fx)\n",
      one_thread_ms, one_thread_ms / Median(walls), alone_one_ms, alone_one_ms / alone_ms);
  if (!old_walls.empty()) {
    std::printf("old way: median %.1f ms wall, CPU median %.1f ms (%.1fx, %.1fx CPU)\n",
                Median(old_walls), Median(old_cpus), Median(old_walls) / Median(walls),
                Median(old_cpus) / Median(cpus));
  }
  std::printf("load average: %s", [] {
    static char buf[128] = "?\n";
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
      if (std::fgets(buf, sizeof buf, f) == nullptr) std::snprintf(buf, sizeof buf, "?\n");
      std::fclose(f);
    }
    return buf;
  }());
  std::printf("dump %u vCPUs x %llu records: %.0f ms, %llu bytes\n", o.vcpus,
              static_cast<unsigned long long>(o.records), Median(walls),
              static_cast<unsigned long long>(bytes));
  std::printf("accounting: written = read + overwritten + skipped %s for all %d dumps\n",
              identity_ok ? "holds exactly" : "FAILS", o.dumps + o.compare + 3);
  return identity_ok ? 0 : 1;
}
