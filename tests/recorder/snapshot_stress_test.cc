// Stress test of the snapshot path as a dump takes it: vCPU threads record exits at full speed
// while a reader takes Recorder::Snapshot (bulk ring copy, resolution, conversion) and
// serialises it, and the streamed dump (Recorder::WriteDump) reads the rings straight into its
// file. TSan does not model the seqlock's atomic_thread_fence, so the seqlock is
// proven by content: every field of every exit is derived from one sequence number n (carried
// as the guest value), and the reader checks that each record it got is that record, whole.
// Labelled `concurrency` (make tsan).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "exitscope/dump.h"
#include "exitscope/flight_recorder.h"
#include "exitscope/recorder.h"

namespace exitscope {
namespace {

constexpr uint32_t kVcpus = 4;
constexpr uint64_t kNvmeBase = 0xfebf0000;
constexpr uint64_t kUart = 0x3f8;

// Snapshots the reader takes while the writers run.
int Snapshots() {
#if defined(__SANITIZE_THREAD__)
  return 40;
#else
  return 300;
#endif
}

uint64_t Iterations() {
#if defined(__SANITIZE_THREAD__)
  return 20000;
#else
  return 300000;
#endif
}

// The exit number n of a vCPU: MMIO writes and reads on two NVMe BARs (doorbells, CC, CSTS),
// PIO on a UART, HLT, with sizes and directions that vary with n.
struct Want {
  ExitKind kind;
  uint64_t addr;
  uint8_t size;
  AccessDir dir;
};
Want ExitFor(uint64_t n) {
  switch (n % 5) {
    case 0:
      return {ExitKind::kMmio, kNvmeBase + 0x1000 + 8 * (n % 64), 4, AccessDir::kWrite};
    case 1:
      return {ExitKind::kMmio, kNvmeBase + 0x4000 + 0x14 + (n % 2) * 8, 4, AccessDir::kRead};
    case 2:
      return {ExitKind::kPio, kUart + n % 8, 1, (n & 8) ? AccessDir::kWrite : AccessDir::kRead};
    case 3:
      return {ExitKind::kMmio, kNvmeBase + 0x1000 + 8 * (n % 16) + 2, 2, AccessDir::kWrite};
    default:
      return {ExitKind::kHlt, 0, 0, AccessDir::kNone};
  }
}

// The writers end by themselves; a failed ASSERT in the reader must still join them.
struct Joiner {
  std::vector<std::thread>& threads;
  ~Joiner() {
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }
};

void Record(Recorder& r, uint32_t v, uint64_t n) {
  const Want w = ExitFor(n);
  if (w.dir == AccessDir::kWrite) {
    r.BeginExit(v, w.kind, w.addr, w.size, w.dir, n);
    r.EndExit(v);
  } else {
    r.BeginExit(v, w.kind, w.addr, w.size, w.dir);
    r.EndExit(v, n);  // the value a read returns (or, for HLT, any value the VMM records)
  }
}

// Checks every field of every exit of `d`; returns the number checked. `prev_skipped` carries
// each ring's skipped counter from the previous snapshot (the counter is cumulative).
uint64_t CheckDump(const Dump& d, const AddressSpace& space, std::vector<uint64_t>* prev_skipped) {
  uint64_t checked = 0;
  EXPECT_EQ(d.vcpus.size(), kVcpus);
  for (const DumpVcpu& v : d.vcpus) {
    // The counters are those of the instant the ring was copied.
    const RingCounters& c = v.counters;
    const uint64_t skipped = c.skipped - (*prev_skipped)[v.vcpu];
    (*prev_skipped)[v.vcpu] = c.skipped;
    EXPECT_EQ(c.written, v.exits.size() + c.overwritten + skipped) << "vCPU " << v.vcpu;
    EXPECT_EQ(c.overwritten, c.written > c.capacity ? c.written - c.capacity : 0);
    const DumpExit* prev = nullptr;
    for (const DumpExit& e : v.exits) {
      const uint64_t n = e.value;
      const Want w = ExitFor(n);
      const Resolution res = space.Lookup(SpaceOf(w.kind), w.addr, w.size, w.dir);
      EXPECT_EQ(e.vcpu, v.vcpu);
      EXPECT_EQ(e.kind, w.kind) << "n=" << n;
      EXPECT_EQ(e.addr, w.addr) << "n=" << n;
      EXPECT_EQ(e.size, w.size) << "n=" << n;
      EXPECT_EQ(e.dir, w.dir) << "n=" << n;
      EXPECT_EQ(e.flags, kExitFlagValue) << "n=" << n;
      const bool has_target = w.kind == ExitKind::kMmio || w.kind == ExitKind::kPio;
      EXPECT_EQ(e.device, has_target ? res.device : kUnassigned) << "n=" << n;
      EXPECT_EQ(e.reg, has_target ? res.reg.reg : kNoRegister) << "n=" << n;
      EXPECT_EQ(e.reg_element, has_target ? res.reg.element : 0) << "n=" << n;
      EXPECT_EQ(e.reg_delta, has_target ? res.reg.delta : 0) << "n=" << n;
      if (prev != nullptr) {
        // Oldest first, one vCPU thread: numbers grow and exits do not overlap in time
        // (2 ns for the rounding of two tick-to-ns conversions).
        EXPECT_GT(n, prev->value);
        EXPECT_GE(e.start_ns + 2, prev->start_ns + prev->duration_ns) << "n=" << n;
      }
      prev = &e;
      ++checked;
      if (::testing::Test::HasFailure()) return checked;
    }
  }
  return checked;
}

// A recorder with small rings (the writers lap the reader while it copies), two NVMe BARs
// and a UART.
std::unique_ptr<Recorder> MakeRecorder() {
  RecorderOptions o;
  o.num_vcpus = kVcpus;
  o.events_per_vcpu = 64;
  o.slow_exit.threshold_ns = 3'600'000'000'000ull;  // no slow flag even when preempted
  o.watchdog.stuck_exit_ns = 3'600'000'000'000ull;
  auto rec = std::move(*Recorder::Create(o));
  rec->SetLogSink([](std::string_view) {});
  AddressSpace& as = rec->address_space();
  for (int i = 0; i < 2; ++i) {
    const uint32_t d = *as.AddDevice({.name = "nvme" + std::to_string(i), .kind = "nvme"});
    EXPECT_TRUE(as.AddRange(IoSpace::kMmio, kNvmeBase + 0x4000ull * i, 0x4000, d,
                            *RegisterMap::Builtin("nvme"))
                    .has_value());
  }
  const uint32_t uart = *as.AddDevice({.name = "uart0", .kind = "uart16550"});
  EXPECT_TRUE(
      as.AddRange(IoSpace::kPio, kUart, 8, uart, *RegisterMap::Builtin("uart16550")).has_value());
  return rec;
}

TEST(SnapshotStressTest, EveryFieldOfEverySnapshotRecordIsWhole) {
  auto rec = MakeRecorder();
  ASSERT_FALSE(HasFailure());
  AddressSpace& as = rec->address_space();

  std::atomic<bool> reading{false}, stop{false};
  std::vector<uint64_t> recorded(kVcpus, 0);  // each written by its vCPU thread, read after join
  std::vector<std::thread> vcpus;
  Joiner joiner{vcpus};
  for (uint32_t v = 0; v < kVcpus; ++v) {
    vcpus.emplace_back([&, v] {
      while (!reading.load()) std::this_thread::yield();
      uint64_t n = 1;
      for (; !stop.load(std::memory_order_relaxed); ++n) Record(*rec, v, n);
      recorded[v] = n - 1;
    });
  }
  struct Stopper {  // a failed ASSERT below must still stop the writers before joining them
    std::atomic<bool>& stop;
    ~Stopper() { stop.store(true); }
  } stopper{stop};
  std::vector<uint64_t> prev_skipped(kVcpus, 0);
  uint64_t checked = 0, snapshots = 0, round_trips = 0;
  reading.store(true);
  for (bool last = false; !last && !HasFailure();) {  // and one more after the writers end
    if (snapshots == static_cast<uint64_t>(Snapshots())) {
      stop.store(true);
      for (auto& t : vcpus) t.join();
      last = true;
    }
    const Dump d = rec->Snapshot({.include_guest_data = true});
    checked += CheckDump(d, as, &prev_skipped);
    ++snapshots;
    if (snapshots % 8 == 1 || last) {  // what a dump file holds is what the snapshot held
      auto back = ParseDump(SerializeDump(d, {.include_guest_data = true}), "stress");
      ASSERT_TRUE(back.has_value()) << back.error().message;
      ASSERT_EQ(back->vcpus.size(), d.vcpus.size());
      for (size_t i = 0; i < d.vcpus.size(); ++i) {
        const DumpVcpu& a = d.vcpus[i];
        const DumpVcpu& b = back->vcpus[i];
        ASSERT_EQ(b.exits.size(), a.exits.size());
        EXPECT_EQ(b.counters.written, a.counters.written);
        EXPECT_EQ(b.counters.overwritten, a.counters.overwritten);
        EXPECT_EQ(b.counters.skipped, a.counters.skipped);
        for (size_t k = 0; k < a.exits.size(); ++k) {
          const DumpExit& x = a.exits[k];
          const DumpExit& y = b.exits[k];
          ASSERT_TRUE(x.start_ns == y.start_ns && x.duration_ns == y.duration_ns &&
                      x.addr == y.addr && x.value == y.value && x.vcpu == y.vcpu &&
                      x.device == y.device && x.reg == y.reg && x.reg_element == y.reg_element &&
                      x.reg_delta == y.reg_delta && x.kind == y.kind && x.size == y.size &&
                      x.dir == y.dir && x.flags == y.flags)
              << "vCPU " << i << " exit " << k << " changed in the round trip";
        }
      }
      ++round_trips;
    }
  }
  ASSERT_FALSE(HasFailure());
  uint64_t skipped = 0;
  for (uint32_t v = 0; v < kVcpus; ++v) {
    const RingCounters c = rec->ring_counters(v);
    EXPECT_EQ(c.written, recorded[v]);
    skipped += c.skipped;
  }
  std::printf("checked %llu records in %llu snapshots (%llu round trips), skipped %llu\n",
              static_cast<unsigned long long>(checked), static_cast<unsigned long long>(snapshots),
              static_cast<unsigned long long>(round_trips),
              static_cast<unsigned long long>(skipped));
  EXPECT_GT(snapshots, 1u);
  EXPECT_GT(checked, 0u);
}

// The streamed dump (Recorder::WriteDump, what es_write_dump and the dump signal use) while the
// vCPUs run: every record read back from every file is whole, the accounting holds per file,
// and an exit shown in progress is never also in its vCPU's ring: the ring was cut just before
// it if it ended while the dump ran (or, when the ring overwrote its record meanwhile, every
// ring exit is later than it).
TEST(SnapshotStressTest, EveryFieldOfEveryStreamedDumpRecordIsWhole) {
  auto rec = MakeRecorder();
  ASSERT_FALSE(HasFailure());
  AddressSpace& as = rec->address_space();
  const std::string path =
      ::testing::TempDir() + "exitscope-stream-stress-" + std::to_string(getpid()) + ".esdump";
  std::atomic<bool> reading{false}, stop{false};
  std::vector<std::thread> vcpus;
  Joiner joiner{vcpus};
  for (uint32_t v = 0; v < kVcpus; ++v) {
    vcpus.emplace_back([&, v] {
      while (!reading.load()) std::this_thread::yield();
      for (uint64_t n = 1; !stop.load(std::memory_order_relaxed); ++n) Record(*rec, v, n);
    });
  }
  struct Stopper {
    std::atomic<bool>& stop;
    ~Stopper() { stop.store(true); }
  } stopper{stop};
  std::vector<uint64_t> prev_skipped(kVcpus, 0);
  uint64_t checked = 0, in_progress = 0, overwritten_in_progress = 0;
  const int dumps = Snapshots() / 3;
  reading.store(true);
  for (int k = 0; k <= dumps && !HasFailure(); ++k) {
    if (k == dumps) {  // one more after the writers end
      stop.store(true);
      for (auto& t : vcpus) t.join();
    }
    // On 1, 2 and 3 coding threads in turn.
    const Status st = rec->WriteDump(
        path, {.include_guest_data = true, .threads = static_cast<uint32_t>(1 + k % 3)});
    ASSERT_TRUE(st.has_value()) << st.error().message;
    auto d = ReadDump(path);
    ASSERT_TRUE(d.has_value()) << d.error().message;
    checked += CheckDump(*d, as, &prev_skipped);
    for (const DumpVcpu& v : d->vcpus) {
      if (!v.in_progress || v.exits.empty()) continue;
      ++in_progress;
      // The ring was cut just before the exit in progress (all ring exits end before it
      // starts) or, if its record was overwritten while the dump ran, all start after it.
      const DumpExit& last = v.exits.back();
      const DumpExit& first = v.exits.front();
      const bool before = v.in_progress->start_ns + 2 >= last.start_ns + last.duration_ns;
      const bool after = first.start_ns > v.in_progress->start_ns;
      EXPECT_TRUE(before || after) << "vCPU " << v.vcpu << ": the exit in progress (start "
                                   << v.in_progress->start_ns << ") is among the ring's";
      overwritten_in_progress += after ? 1 : 0;
      // A write carries its number from BeginExit on: it must be newer than the ring's.
      if (before && v.in_progress->dir == AccessDir::kWrite) {
        EXPECT_GT(v.in_progress->value, last.value);
      }
    }
  }
  std::remove(path.c_str());
  std::printf(
      "checked %llu records in %d streamed dumps (%llu vCPUs with an exit in progress, %llu of "
      "them overwritten in the ring since)\n",
      static_cast<unsigned long long>(checked), dumps + 1,
      static_cast<unsigned long long>(in_progress),
      static_cast<unsigned long long>(overwritten_in_progress));
  EXPECT_GT(checked, 0u);
}

// The chunked ring snapshot a dump uses, on a bare ring: each chunk holds whole records (all
// fields derived from n), in order, and the stats add up: written = copied + skipped +
// overwritten for every snapshot.
TEST(SnapshotStressTest, ChunkedRingSnapshotIsWholeAndAddsUp) {
  ExitRing ring(64);
  std::atomic<bool> reading{false}, done{false};
  std::vector<std::thread> writer;
  Joiner joiner{writer};
  writer.emplace_back([&] {
    while (!reading.load()) std::this_thread::yield();
    for (uint64_t n = 1; n <= Iterations(); ++n) {
      ExitRecord r;
      r.start_ticks = n;
      r.duration_ticks = n * 7;
      r.addr = n ^ 0x5555555555555555ull;
      r.value = ~n;
      r.vcpu = static_cast<uint32_t>(n >> 1);
      r.device = static_cast<uint32_t>(n * 3);
      r.reg = static_cast<uint32_t>(n >> 3);
      r.reg_element = static_cast<uint32_t>(n * 5);
      r.reg_delta = static_cast<uint32_t>(n & 3);
      r.kind = static_cast<ExitKind>(n % kExitKindCount);
      r.size = static_cast<uint8_t>(n);
      r.dir = static_cast<AccessDir>(n % 3);
      r.flags = static_cast<uint8_t>(n >> 8);
      ring.Write(r);
    }
    done.store(true);
  });
  ExitRecord chunk[5];  // a chunk smaller than the ring: many chunks per snapshot
  uint64_t snapshots = 0, checked = 0;
  reading.store(true);
  for (bool last = false; !last && !HasFailure();) {
    last = done.load();
    uint64_t prev = 0, seen = 0;
    const ExitRing::SnapshotStats st =
        ring.SnapshotChunked(0, chunk, 5, [&](const ExitRecord* recs, size_t n) {
          ASSERT_LE(n, 5u);
          for (size_t i = 0; i < n; ++i) {
            const ExitRecord& r = recs[i];
            const uint64_t k = r.start_ticks;
            ASSERT_TRUE(r.duration_ticks == k * 7 && r.addr == (k ^ 0x5555555555555555ull) &&
                        r.value == ~k && r.vcpu == static_cast<uint32_t>(k >> 1) &&
                        r.device == static_cast<uint32_t>(k * 3) &&
                        r.reg == static_cast<uint32_t>(k >> 3) &&
                        r.reg_element == static_cast<uint32_t>(k * 5) &&
                        r.reg_delta == static_cast<uint32_t>(k & 3) &&
                        r.kind == static_cast<ExitKind>(k % kExitKindCount) &&
                        r.size == static_cast<uint8_t>(k) &&
                        r.dir == static_cast<AccessDir>(k % 3) &&
                        r.flags == static_cast<uint8_t>(k >> 8))
                << "torn record n=" << k;
            ASSERT_GT(k, prev);
            prev = k;
          }
          seen += n;
        });
    ASSERT_EQ(st.copied, seen);
    const uint64_t overwritten = st.written > 64 ? st.written - 64 : 0;
    ASSERT_EQ(st.written, st.copied + st.skipped + overwritten);
    checked += seen;
    ++snapshots;
  }
  writer[0].join();
  EXPECT_GT(snapshots, 1u);
  EXPECT_GT(checked, 0u);
}

}  // namespace
}  // namespace exitscope
