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
  constexpr uint64_t kPerThread = 300000;
  std::vector<std::thread> writers;
  for (uint64_t w = 0; w < 2; ++w) {
    writers.emplace_back([&t, w] {
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
    });
  }
  uint64_t reported = 0, bad = 0;
  std::set<uint64_t> ids;
  std::thread collector([&] {
    std::vector<InflightIoTable::Entry> out;
    while (!stop.load(std::memory_order_relaxed)) {
      out.clear();
      t.CollectAged(~0ull, &out);
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
  EXPECT_EQ(bad, 0u) << "of " << reported << " reported entries";
  EXPECT_EQ(t.in_flight(), 0u);
  EXPECT_EQ(t.untracked(), t.overflow()) << "every untracked completion is an overflowed submit";
}

}  // namespace
}  // namespace exitscope
