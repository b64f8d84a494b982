// The watchdog and the vCPU race on the stall flag. Whatever the interleaving, every "stuck"
// finding is followed by exactly one end finding for the same exit; and a stuck exit logs two
// lines (stuck, ended), not three. (Durations are not compared: the TSC of this nested host
// is not synchronised across CPUs, so "so far" on the watchdog's CPU may exceed the total.)
// No timing asserts: exit lengths only make races likely, the checks hold for any schedule.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "exitscope/recorder.h"

namespace exitscope {
namespace {

using Clk = std::chrono::steady_clock;

void BusyFor(std::chrono::microseconds d) {
  const auto until = Clk::now() + d;
  while (Clk::now() < until) {
  }
}

TEST(WatchdogRace, EveryStuckFindingGetsExactlyOneEndFinding) {
  RecorderOptions o;
  o.num_vcpus = 2;
  o.events_per_vcpu = 1024;
  o.findings = 65536;
  o.slow_exit.threshold_ns = 1'000'000'000;  // only stall findings in this test
  // 1 us: every exit in progress at a poll (every 1 ms) is stuck, and exits of a few us end
  // all the time while the watchdog reports them.
  o.watchdog.stuck_exit_ns = 1'000;
  auto rec = Recorder::Create(o);
  ASSERT_TRUE(rec) << rec.error().message;
  Recorder& r = **rec;
  r.SetLogSink([](std::string_view) {});
  std::mutex mu;
  std::vector<FindingRecord> seen;  // in hook order
  r.SetFindingHook([&](const FindingRecord& f) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(f);
  });
  constexpr int kExits = 100000;
  std::vector<std::thread> vcpus;
  for (uint32_t v = 0; v < 2; ++v) {
    vcpus.emplace_back([&r, v] {
      for (int i = 0; i < kExits; ++i) {
        // Each exit is told apart by its address.
        r.BeginExit(v, ExitKind::kHypercall, (uint64_t{v} << 32) | static_cast<uint64_t>(i));
        BusyFor(std::chrono::microseconds(1 + i % 5));
        r.EndExit(v);
      }
    });
  }
  for (auto& t : vcpus) t.join();
  r.StopWatchdog();  // emits the end of a stall that ended after the last poll

  std::lock_guard<std::mutex> lock(mu);
  std::map<uint64_t, int> begin_at, ends;  // addr -> index of the begin, number of ends
  size_t begins = 0;
  for (size_t i = 0; i < seen.size(); ++i) {
    const FindingRecord& f = seen[i];
    if (f.type == FindingType::kStuckExitBegin) {
      ++begins;
      EXPECT_EQ(begin_at.count(f.addr), 0u) << "exit " << f.addr << " reported stuck twice";
      begin_at[f.addr] = static_cast<int>(i);
    } else if (f.type == FindingType::kStuckExitEnd) {
      ++ends[f.addr];
      ASSERT_EQ(begin_at.count(f.addr), 1u) << "end before begin: " << f.text;
      EXPECT_NE(f.text.find("ended after"), std::string::npos) << f.text;
    }
  }
  EXPECT_GT(begins, 0u);  // the test exercised stalls at all
  for (const auto& [addr, idx] : begin_at) {
    EXPECT_EQ(ends[addr], 1) << "stuck finding '" << seen[static_cast<size_t>(idx)].text << "' has "
                             << ends[addr] << " end findings";
  }
}

TEST(WatchdogLog, AStuckSlowExitLogsTwoLinesAndKeepsThreeFindings) {
  RecorderOptions o;
  o.num_vcpus = 1;
  o.slow_exit.threshold_ns = 5'000'000;
  o.watchdog.stuck_exit_ns = 5'000'000;
  auto rec = Recorder::Create(o);
  ASSERT_TRUE(rec) << rec.error().message;
  Recorder& r = **rec;
  std::mutex mu;
  std::vector<std::string> lines;
  r.SetLogSink([&](std::string_view l) {
    std::lock_guard<std::mutex> lock(mu);
    lines.emplace_back(l);
  });
  r.BeginExit(0, ExitKind::kHlt);
  // Wait (generously) until the watchdog has seen it stuck, then end it.
  for (int i = 0; i < 2000 && r.Findings().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_FALSE(r.Findings().empty());
  r.EndExit(0);
  r.StopWatchdog();
  std::lock_guard<std::mutex> lock(mu);
  // The stall's lines. Stack captures add theirs (stack_capture_test): indented frames, and
  // "still stuck in" for each later capture.
  std::erase_if(lines, [](const std::string& l) {
    return l.starts_with(" ") || l.find("still stuck in") != std::string::npos;
  });
  ASSERT_EQ(lines.size(), 2u) << (lines.empty() ? "" : lines.back());
  EXPECT_NE(lines[0].find("stuck in exit HLT"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("ended after"), std::string::npos) << lines[1];
  std::vector<FindingRecord> f = r.Findings();
  // Later stack captures of the stall (at 4x, 16x the threshold) are findings of their own.
  std::erase_if(f, [](const FindingRecord& x) { return x.type == FindingType::kStuckExitStack; });
  ASSERT_EQ(f.size(), 3u);  // the report stays complete: stuck, end, slow
  EXPECT_EQ(f[0].type, FindingType::kStuckExitBegin);
  size_t ends = 0, slow = 0;
  for (const FindingRecord& x : f) {
    ends += x.type == FindingType::kStuckExitEnd;
    slow += x.type == FindingType::kSlowExit;
  }
  EXPECT_EQ(ends, 1u);
  EXPECT_EQ(slow, 1u);
  EXPECT_EQ(r.counters().slow_exits, 1u);
}

}  // namespace
}  // namespace exitscope
