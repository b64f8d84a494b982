// InflightIoTable under churn: the watchdog's CollectAged runs while I/Os are submitted and
// completed on other threads in a table small enough that slots are reused all the time.
// Every entry it reports must be one I/O as it was submitted (device, id and start of the same
// submission), never fields of two submissions mixed; and each submission is reported once.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "exitscope/watchdog.h"

namespace exitscope {
namespace {

uint32_t DeviceOf(uint64_t id) {
  return static_cast<uint32_t>(id * 2654435761u) & 0xffff;
}
uint64_t StartOf(uint64_t id) {
  return id * 3 + 1;
}

TEST(InflightIoRace, CollectAgedNeverMixesTwoSubmissions) {
  InflightIoTable t(16);
  std::atomic<bool> stop{false};
  // The writers start once the collector runs; `writing` counts those writing and not done.
  std::atomic<bool> go{false};
  std::atomic<int> writing{0};
  constexpr int kWriters = 2;
  constexpr uint64_t kPerThread = 300000;
  std::vector<std::thread> writers;
  for (uint64_t w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      while (!go.load()) std::this_thread::yield();
      writing.fetch_add(1);
      // Six I/Os in flight per writer: the 16-slot table is mostly full, and slots are freed
      // and claimed again all the time under the collector.
      constexpr uint64_t kWindow = 6;
      for (uint64_t i = 0; i < kPerThread + kWindow; ++i) {
        if (i < kPerThread) {
          const uint64_t id = (w << 40) | (i + 1);
          t.Submit(DeviceOf(id), id, StartOf(id));
        }
        if (i >= kWindow) {
          const uint64_t old = (w << 40) | (i - kWindow + 1);
          t.Complete(DeviceOf(old), old);
        }
      }
      writing.fetch_sub(1);
    });
  }
  uint64_t reported = 0, bad = 0;
  // Collections that began and ended with every writer writing (each starts and ends once), and
  // the entries they reported: what makes this test a race at all.
  uint64_t overlapped = 0, reported_overlapped = 0;
  std::set<uint64_t> ids;
  std::thread collector([&] {
    std::vector<InflightIoTable::Entry> out;
    go.store(true);
    while (!stop.load(std::memory_order_relaxed)) {
      out.clear();
      const bool all_before = writing.load() == kWriters;
      t.CollectAged(~0ull, &out);
      if (all_before && writing.load() == kWriters) {
        ++overlapped;
        reported_overlapped += out.size();
      }
      for (const InflightIoTable::Entry& e : out) {
        ++reported;
        if (e.device != DeviceOf(e.io_id) || e.start_ticks != StartOf(e.io_id)) ++bad;
        if (!ids.insert(e.io_id).second) ++bad;  // reported twice
      }
    }
  });
  for (auto& th : writers) th.join();
  stop.store(true);
  collector.join();
  EXPECT_GT(overlapped, 0u) << "the collector never ran while both writers did";
  EXPECT_GT(reported_overlapped, 0u) << "nothing was reported while the writers ran";
  EXPECT_EQ(bad, 0u) << "of " << reported << " reported entries";
  EXPECT_EQ(t.in_flight(), 0u);
  EXPECT_EQ(t.untracked(), t.overflow()) << "every untracked completion is an overflowed submit";
}

}  // namespace
}  // namespace exitscope
