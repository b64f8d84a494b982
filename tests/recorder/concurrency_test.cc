// Stress tests: writers keep running while readers snapshot. Every record a reader gets must be
// intact (torn ones are skipped and counted, never returned). Labelled `concurrency` (make tsan).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "exitscope/address_space.h"
#include "exitscope/device_events.h"
#include "exitscope/flight_recorder.h"
#include "exitscope/recorder.h"

namespace exitscope {
namespace {

constexpr int kWriters = 4;

uint64_t Iterations() {
#if defined(__SANITIZE_THREAD__)
  return 20000;
#else
  return 300000;
#endif
}

// Every field derived from n: any mix of two records is detected.
ExitRecord Derived(uint32_t vcpu, uint64_t n) {
  ExitRecord r;
  r.start_ticks = n;
  r.duration_ticks = n * 7 + vcpu;
  r.addr = n ^ 0x5555555555555555ull;
  r.value = ~n;
  r.vcpu = vcpu;
  r.device = static_cast<uint32_t>(n * 3);
  r.reg = static_cast<uint32_t>(n >> 3);
  r.reg_element = static_cast<uint32_t>(n * 5);
  r.reg_delta = static_cast<uint32_t>(n & 3);
  r.kind = static_cast<ExitKind>(n % kExitKindCount);
  r.size = static_cast<uint8_t>(n);
  r.dir = static_cast<AccessDir>(n % 3);
  r.flags = static_cast<uint8_t>(n >> 8);
  return r;
}

TEST(ConcurrencyTest, ExitRingSnapshotsNeverReturnTornRecords) {
  FlightRecorder fr(kWriters, 16);  // tiny rings: readers constantly race the writers
  std::atomic<bool> done{false}, reading{false};
  std::vector<std::thread> writers;
  for (uint32_t v = 0; v < kWriters; ++v) {
    writers.emplace_back([&, v] {
      // Start writing only once the reader runs: on a loaded machine the writers could
      // otherwise finish before the reader's first snapshot, and nothing would race.
      while (!reading.load()) std::this_thread::yield();
      for (uint64_t n = 1; n <= Iterations(); ++n) fr.ring(v).Write(Derived(v, n));
    });
  }
  uint64_t checked = 0, snapshots = 0;
  std::thread reader([&] {
    std::vector<ExitRecord> out;
    reading.store(true);
    for (bool last = false; !last;) {  // at least one pass, and one after the writers end
      last = done.load();
      for (uint32_t v = 0; v < kWriters; ++v) {
        out.clear();
        fr.ring(v).Snapshot(&out);
        uint64_t prev = 0;
        for (const ExitRecord& r : out) {
          const ExitRecord want = Derived(v, r.start_ticks);
          ASSERT_EQ(std::memcmp(&r, &want, sizeof r), 0) << "torn record n=" << r.start_ticks;
          ASSERT_GT(r.start_ticks, prev);
          prev = r.start_ticks;
          ++checked;
        }
        ++snapshots;
      }
    }
  });
  for (auto& t : writers) t.join();
  done.store(true);
  reader.join();
  uint64_t skipped = 0;
  for (uint32_t v = 0; v < kWriters; ++v) {
    const RingCounters c = fr.ring(v).counters();
    EXPECT_EQ(c.written, Iterations());
    EXPECT_EQ(c.overwritten, Iterations() - 16);
    skipped += c.skipped;
  }
  std::printf("checked %llu records in %llu snapshots, skipped (torn/overwritten) %llu\n",
              static_cast<unsigned long long>(checked), static_cast<unsigned long long>(snapshots),
              static_cast<unsigned long long>(skipped));
  EXPECT_GT(snapshots, 0u);
}

TEST(ConcurrencyTest, RecorderSnapshotWhileVcpusRun) {
  RecorderOptions o;
  o.num_vcpus = kWriters;
  o.events_per_vcpu = 256;
  o.start_watchdog = true;
  o.watchdog.poll_ns = 1'000'000;
  auto rec = std::move(*Recorder::Create(o));
  rec->SetLogSink([](std::string_view) {});
  const uint32_t nvme = *rec->address_space().AddDevice({.name = "nvme0", .kind = "nvme"});
  ASSERT_TRUE(rec->address_space()
                  .AddRange(IoSpace::kMmio, 0xfebf0000, 0x4000, nvme, *RegisterMap::Builtin("nvme"))
                  .has_value());
  std::atomic<bool> done{false};
  std::vector<std::thread> vcpus;
  const uint64_t iters = Iterations() / 4;
  for (uint32_t v = 0; v < kWriters; ++v) {
    vcpus.emplace_back([&, v] {
      for (uint64_t n = 0; n < iters; ++n) {
        const uint64_t addr = 0xfebf1000 + 8 * (n % 64);  // SQ(n%64)TDBL
        rec->BeginExit(v, ExitKind::kMmio, addr, 4, AccessDir::kWrite, n);
        rec->EndExit(v);
        if (n % 64 == 0) rec->IoSubmit(nvme, v * iters + n);
        if (n % 64 == 1) rec->IoComplete(nvme, v * iters + n - 1);
      }
    });
  }
  uint64_t checked = 0;
  while (!done.load()) {
    Dump d = rec->Snapshot({.include_guest_data = true});
    for (const DumpVcpu& v : d.vcpus) {
      uint64_t prev = 0;
      bool first = true;
      for (const DumpExit& e : v.exits) {
        ASSERT_EQ(e.vcpu, v.vcpu);
        ASSERT_EQ(e.addr, 0xfebf1000 + 8 * (e.value % 64));
        ASSERT_EQ(e.device, nvme);
        ASSERT_EQ(e.reg_element, e.value % 64);
        ASSERT_EQ(d.RegisterName(e), "SQ" + std::to_string(e.value % 64) + "TDBL");
        if (!first) {
          ASSERT_GT(e.value, prev);
        }
        prev = e.value;
        first = false;
        ++checked;
      }
    }
    bool all = true;
    for (uint32_t v = 0; v < kWriters; ++v) all &= rec->ring_counters(v).written >= iters;
    if (all) done.store(true);
  }
  for (auto& t : vcpus) t.join();
  EXPECT_GT(checked, 0u);
  EXPECT_EQ(rec->counters().io_in_flight + rec->counters().io_inflight_overflow, 0u);
}

TEST(ConcurrencyTest, DeviceEventsFromManyThreads) {
  DeviceEventRing ring(64);
  std::atomic<bool> done{false};
  const uint64_t per = Iterations() / 4;
  std::vector<std::thread> producers;
  for (uint64_t p = 0; p < kWriters; ++p) {
    producers.emplace_back([&, p] {
      for (uint64_t k = 0; k < per; ++k) {
        DeviceEventRecord e;
        e.io_id = (p << 32) | k;
        e.status = static_cast<int64_t>(~e.io_id);
        e.time_ticks = e.io_id * 3;
        e.device = static_cast<uint32_t>(p);
        e.type = static_cast<DeviceEventType>(k % 5);
        e.SetNote(std::to_string(e.io_id));
        ring.Write(e);
      }
    });
  }
  std::thread reader([&] {
    std::vector<DeviceEventRecord> out;
    while (!done.load()) {
      out.clear();
      ring.Snapshot(&out);
      for (const DeviceEventRecord& e : out) {
        ASSERT_EQ(e.status, static_cast<int64_t>(~e.io_id));
        ASSERT_EQ(e.time_ticks, e.io_id * 3);
        ASSERT_EQ(e.device, e.io_id >> 32);
        ASSERT_EQ(static_cast<uint64_t>(e.type), (e.io_id & 0xffffffff) % 5);
        ASSERT_EQ(e.text(), std::to_string(e.io_id));
      }
    }
  });
  for (auto& t : producers) t.join();
  done.store(true);
  reader.join();
  const DeviceEventCounters c = ring.counters();
  EXPECT_EQ(c.written, per * kWriters);
  std::vector<DeviceEventRecord> out;
  ring.Snapshot(&out);
  EXPECT_EQ(out.size() + c.dropped >= 64 ? 64u : out.size(), out.size());
}

TEST(ConcurrencyTest, LookupWhileRangesMove) {
  AddressSpace as;
  constexpr int kDevices = 64;
  for (int i = 0; i < kDevices; ++i) {
    const uint32_t d = *as.AddDevice({.name = "d" + std::to_string(i), .kind = "x"});
    ASSERT_TRUE(as.AddRange(IoSpace::kMmio, 0x100000 + 0x10000ull * i, 0x1000, d).has_value());
  }
  std::atomic<bool> done{false};
  std::thread mover([&] {
  // Each device moves between its A base and its B base (B = A + 0x8000): BAR reprogramming.
#if defined(__SANITIZE_THREAD__)
    constexpr int kRounds = 10;
#else
    constexpr int kRounds = 100;
#endif
    for (int round = 0; round < kRounds; ++round) {
      for (int i = 0; i < kDevices; ++i) {
        const uint64_t a = 0x100000 + 0x10000ull * i;
        const uint64_t from = (round % 2 == 0) ? a : a + 0x8000;
        const uint64_t to = (round % 2 == 0) ? a + 0x8000 : a;
        ASSERT_TRUE(as.MoveRange(IoSpace::kMmio, from, to).has_value());
      }
    }
    done.store(true);
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      uint64_t n = static_cast<uint64_t>(t);
      while (!done.load()) {
        const int i = static_cast<int>(n % kDevices);
        const uint64_t off = (n * 13) % 0x1000;
        const uint64_t addr = 0x100000 + 0x10000ull * i + ((n & 64) ? 0x8000 : 0) + off;
        const Resolution r = as.Lookup(IoSpace::kMmio, addr, 4);
        if (r.assigned()) {
          ASSERT_EQ(r.device, static_cast<uint32_t>(i));
          ASSERT_EQ(r.offset, off);
        }
        ++n;
      }
    });
  }
  mover.join();
  for (auto& t : readers) t.join();
}

// Readers against a writer that reloads the whole map (a batch), adds and removes ranges: the
// tables the writer replaces are freed while the readers run (ThreadSanitizer, or ASan's
// use-after-free, catches a table freed under a reader), every answer is one a published
// table gave, and once the readers stop one more mutation leaves no old table behind.
TEST(ConcurrencyTest, LookupWhileTheMapIsReloaded) {
  AddressSpace as;
  constexpr uint64_t kBase = 0x100000000ull;
  constexpr int kDevices = 256;
  {
    AddressSpace::Batch b = as.BeginBatch();
    for (int i = 0; i < kDevices; ++i) {
      const uint32_t d = *b.AddDevice({.name = "d" + std::to_string(i), .kind = "x"});
      ASSERT_TRUE(b.AddRange(IoSpace::kMmio, kBase + 0x10000ull * i, 0x1000, d).has_value());
    }
    ASSERT_TRUE(as.Commit(std::move(b)).has_value());
  }
#if defined(__SANITIZE_THREAD__)
  constexpr int kRounds = 100;
#else
  constexpr int kRounds = 1000;
#endif
  std::atomic<bool> done{false};
  size_t max_retained = 0;
  std::thread writer([&] {
    for (int round = 0; round < kRounds; ++round) {
      // Each round adds the range at slot + 0x8000 of one device, in a batch or alone, and
      // takes it away again.
      const int i = round % kDevices;
      const uint64_t extra = kBase + 0x10000ull * i + 0x8000;
      if (round % 2 == 0) {
        AddressSpace::Batch b = as.BeginBatch();
        ASSERT_TRUE(b.AddRange(IoSpace::kMmio, extra, 0x1000, static_cast<uint32_t>(i)));
        ASSERT_TRUE(as.Commit(std::move(b)).has_value());
      } else {
        ASSERT_TRUE(
            as.AddRange(IoSpace::kMmio, extra, 0x1000, static_cast<uint32_t>(i)).has_value());
      }
      ASSERT_TRUE(as.RemoveRange(IoSpace::kMmio, extra).has_value());
      max_retained = std::max(max_retained, as.memory_use().retained_tables);
    }
    done.store(true);
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      uint64_t n = static_cast<uint64_t>(t);
      while (!done.load()) {
        const int i = static_cast<int>((n * 7) % kDevices);
        const uint64_t off = (n * 13) % 0x1000;
        const uint64_t addr = kBase + 0x10000ull * i + ((n & 1) ? 0x8000 : 0) + off;
        const Resolution r = as.Lookup(IoSpace::kMmio, addr, 4);
        if ((n & 1) == 0) {
          ASSERT_TRUE(r.assigned());  // the base ranges never go away
        }
        if (r.assigned()) {
          ASSERT_EQ(r.device, static_cast<uint32_t>(i));
          ASSERT_EQ(r.offset, off);
        }
        if (n % 64 == 0) {
          ASSERT_EQ(as.DeviceName(static_cast<uint32_t>(i)), "d" + std::to_string(i));
        }
        ++n;
      }
    });
  }
  writer.join();
  for (auto& t : readers) t.join();
  // 2 x kRounds + 1 tables were replaced; the readers delay some frees, never all of them.
  std::printf("at most %zu of %d replaced tables waited for a reader at once\n", max_retained,
              2 * kRounds);
  EXPECT_LT(max_retained, static_cast<size_t>(kRounds));
  ASSERT_TRUE(as.AddRange(IoSpace::kPio, 0x3f8, 8, 0).has_value());
  EXPECT_EQ(as.memory_use().retained_tables, 0u);
  EXPECT_EQ(as.Ranges().size(), static_cast<size_t>(kDevices) + 1);
}

}  // namespace
}  // namespace exitscope
