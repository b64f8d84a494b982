#include <gtest/gtest.h>

#include "exitscope/device_events.h"
#include "exitscope/flight_recorder.h"
#include "exitscope/watchdog.h"

namespace exitscope {
namespace {

ExitRecord Rec(uint64_t n) {
  ExitRecord r;
  r.start_ticks = n;
  r.duration_ticks = n * 3;
  r.addr = 0x1000 + n;
  r.kind = ExitKind::kMmio;
  return r;
}

TEST(ExitRingTest, CapacityRoundsUpToPowerOfTwo) {
  EXPECT_EQ(ExitRing(5).capacity(), 8u);
  EXPECT_EQ(ExitRing(8).capacity(), 8u);
  EXPECT_EQ(ExitRing(0).capacity(), 2u);
}

TEST(ExitRingTest, WrapAroundKeepsNewestInOrder) {
  ExitRing ring(8);
  std::vector<ExitRecord> out;
  ring.Snapshot(&out);
  EXPECT_TRUE(out.empty());
  for (uint64_t n = 1; n <= 5; ++n) ring.Write(Rec(n));
  ring.Snapshot(&out);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out.front().start_ticks, 1u);
  EXPECT_EQ(ring.counters().overwritten, 0u);
  for (uint64_t n = 6; n <= 21; ++n) ring.Write(Rec(n));
  out.clear();
  ring.Snapshot(&out);
  ASSERT_EQ(out.size(), 8u);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].start_ticks, 14 + i);
    EXPECT_EQ(out[i].duration_ticks, 3 * (14 + i));
  }
  const RingCounters c = ring.counters();
  EXPECT_EQ(c.capacity, 8u);
  EXPECT_EQ(c.written, 21u);
  EXPECT_EQ(c.overwritten, 13u);
  EXPECT_EQ(c.skipped, 0u);
  out.clear();
  ring.SnapshotNewest(3, &out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].start_ticks, 19u);
  EXPECT_EQ(out[2].start_ticks, 21u);
}

TEST(DeviceEventRingTest, WrapAndNotes) {
  DeviceEventRing ring(4);
  for (int i = 0; i < 6; ++i) {
    DeviceEventRecord e;
    e.type = DeviceEventType::kNote;
    e.io_id = static_cast<uint64_t>(i);
    e.SetNote(i == 5 ? std::string(100, 'x') : "note " + std::to_string(i));
    ring.Write(e);
  }
  std::vector<DeviceEventRecord> out;
  ring.Snapshot(&out);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].io_id, 2u);
  EXPECT_EQ(out[0].text(), "note 2");
  EXPECT_EQ(out[3].text(), std::string(kNoteBytes, 'x'));
  EXPECT_EQ(out[3].truncated, 1);
  const DeviceEventCounters c = ring.counters();
  EXPECT_EQ(c.written, 6u);
  EXPECT_EQ(c.overwritten, 2u);
  EXPECT_EQ(c.dropped, 0u);
}

TEST(InflightIoTableTest, SubmitCompleteAgeOverflow) {
  InflightIoTable t(16);
  EXPECT_EQ(t.capacity(), 16u);
  t.Submit(1, 100, 10);
  t.Submit(1, 101, 50);
  t.Submit(2, 100, 20);  // same id, other device
  EXPECT_EQ(t.in_flight(), 3u);
  t.Complete(1, 100);
  EXPECT_EQ(t.in_flight(), 2u);
  t.Complete(1, 100);  // twice: untracked
  EXPECT_EQ(t.untracked(), 1u);
  std::vector<InflightIoTable::Entry> aged;
  t.CollectAged(30, &aged);
  ASSERT_EQ(aged.size(), 1u);
  EXPECT_EQ(aged[0].device, 2u);
  EXPECT_EQ(aged[0].io_id, 100u);
  aged.clear();
  t.CollectAged(30, &aged);  // reported once
  EXPECT_TRUE(aged.empty());
  t.CollectAged(100, &aged);
  ASSERT_EQ(aged.size(), 1u);
  EXPECT_EQ(aged[0].io_id, 101u);
  t.Complete(2, 100);
  t.Complete(1, 101);
  EXPECT_EQ(t.in_flight(), 0u);
  for (uint64_t i = 0; i < 40; ++i) t.Submit(3, i, 1);
  EXPECT_EQ(t.in_flight() + t.overflow(), 40u);
  EXPECT_GT(t.overflow(), 0u);
}

}  // namespace
}  // namespace exitscope
