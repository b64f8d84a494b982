// The watchdog must notice a stuck exit WHILE it is stuck. Only generous waits, no timing
// asserts.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <thread>

#include "exitscope/recorder.h"

namespace exitscope {
namespace {

using namespace std::chrono_literals;

class Findings {
 public:
  void Add(const FindingRecord& f) {
    std::lock_guard<std::mutex> lock(mu_);
    all_.push_back(f);
    cv_.notify_all();
  }
  // Waits up to `timeout` for a finding of `type`.
  bool WaitFor(FindingType type, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return CountLocked(type) > 0; });
  }
  size_t Count(FindingType type) {
    std::lock_guard<std::mutex> lock(mu_);
    return CountLocked(type);
  }
  std::vector<FindingRecord> All() {
    std::lock_guard<std::mutex> lock(mu_);
    return all_;
  }

 private:
  size_t CountLocked(FindingType type) {
    size_t n = 0;
    for (const auto& f : all_) n += f.type == type;
    return n;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<FindingRecord> all_;
};

std::unique_ptr<Recorder> MakeRecorder(Findings* findings, std::vector<std::string>* log,
                                       std::mutex* log_mu) {
  RecorderOptions o;
  o.num_vcpus = 2;
  o.slow_exit.threshold_ns = 60'000'000'000ull;  // keep slow-exit findings out of the way
  o.watchdog = {.stuck_exit_ns = 20'000'000, .io_age_ns = 30'000'000, .poll_ns = 2'000'000};
  auto r = Recorder::Create(o);
  EXPECT_TRUE(r.has_value());
  (*r)->SetFindingHook([findings](const FindingRecord& f) { findings->Add(f); });
  (*r)->SetLogSink([log, log_mu](std::string_view l) {
    std::lock_guard<std::mutex> lock(*log_mu);
    log->emplace_back(l);
  });
  return std::move(*r);
}

// Waits (generously) until the watchdog has completed `n` more polls than it had on entry.
bool WaitForPolls(const Recorder& rec, uint64_t n) {
  const uint64_t target = rec.watchdog_polls() + n;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (rec.watchdog_polls() < target) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(WatchdogTest, ReportsStuckExitWhileStuckOnceAndAgainAtTheEnd) {
  Findings findings;
  std::vector<std::string> log;
  std::mutex log_mu;
  auto rec = MakeRecorder(&findings, &log, &log_mu);
  ASSERT_TRUE(rec->watchdog_running());
  const uint32_t nvme = *rec->address_space().AddDevice({.name = "nvme0", .kind = "nvme"});
  ASSERT_TRUE(rec->address_space()
                  .AddRange(IoSpace::kMmio, 0xfebf0000, 0x4000, nvme, *RegisterMap::Builtin("nvme"))
                  .has_value());

  std::atomic<bool> release{false};
  std::atomic<bool> ended{false};
  std::thread vcpu([&] {
    rec->BeginExit(1, ExitKind::kMmio, 0xfebf1008, 4, AccessDir::kWrite, 5);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!release.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    ended.store(true);
    rec->EndExit(1);
  });

  ASSERT_TRUE(findings.WaitFor(FindingType::kStuckExitBegin, 20s));
  EXPECT_FALSE(ended.load()) << "the finding must arrive while the exit is still in progress";
  // While still stuck: visible in a snapshot, flagged.
  Dump live = rec->Snapshot();
  ASSERT_TRUE(live.vcpus[1].in_progress.has_value());
  EXPECT_NE(live.vcpus[1].in_progress->flags & kExitFlagStalled, 0);
  EXPECT_GE(live.vcpus[1].in_progress->duration_ns, 20'000'000u);
  // Many more polls, each seeing the exit still stuck: still exactly one report for this stall.
  EXPECT_TRUE(WaitForPolls(*rec, 20)) << "the watchdog stopped polling";  // vcpu still to join
  EXPECT_FALSE(ended.load());
  EXPECT_EQ(findings.Count(FindingType::kStuckExitBegin), 1u);
  release.store(true);
  vcpu.join();
  ASSERT_TRUE(findings.WaitFor(FindingType::kStuckExitEnd, 20s));
  EXPECT_EQ(findings.Count(FindingType::kStuckExitEnd), 1u);

  const auto all = findings.All();
  const FindingRecord* begin = nullptr;
  const FindingRecord* end = nullptr;
  for (const auto& f : all) {
    if (f.type == FindingType::kStuckExitBegin) begin = &f;
    if (f.type == FindingType::kStuckExitEnd) end = &f;
  }
  ASSERT_TRUE(begin && end);
  EXPECT_EQ(begin->vcpu, 1u);
  EXPECT_EQ(begin->device, nvme);
  EXPECT_EQ(begin->text.rfind(
                "vCPU 1: stuck in exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008) for ", 0),
            0u)
      << begin->text;
  EXPECT_GE(end->duration_ns, begin->duration_ns);
  EXPECT_EQ(
      end->text.rfind("vCPU 1: exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008) ended after ", 0),
      0u)
      << end->text;
  {
    std::lock_guard<std::mutex> lock(log_mu);
    // The stall's two lines. Stack captures add their lines (stack_capture_test): indented
    // frames, and "still stuck in" for each later capture.
    EXPECT_EQ(std::count_if(log.begin(), log.end(),
                            [](const std::string& l) {
                              return !l.starts_with(" ") &&
                                     l.find("still stuck in") == std::string::npos;
                            }),
              2);
  }
  // The ring record of that exit carries the stall flag; a new exit is not flagged.
  rec->BeginExit(1, ExitKind::kHlt);
  rec->EndExit(1);
  Dump d = rec->Snapshot();
  ASSERT_EQ(d.vcpus[1].exits.size(), 2u);
  EXPECT_NE(d.vcpus[1].exits[0].flags & kExitFlagStalled, 0);
  EXPECT_EQ(d.vcpus[1].exits[1].flags & kExitFlagStalled, 0);
  EXPECT_EQ(
      std::count_if(d.findings.begin(), d.findings.end(),
                    [](const FindingRecord& x) { return x.type != FindingType::kStuckExitStack; }),
      2);
}

TEST(WatchdogTest, ReportsAgedIoOnce) {
  Findings findings;
  std::vector<std::string> log;
  std::mutex log_mu;
  auto rec = MakeRecorder(&findings, &log, &log_mu);
  const uint32_t blk = *rec->address_space().AddDevice({.name = "vblk0", .kind = "virtio-blk"});
  rec->IoSubmit(blk, 41);
  rec->IoComplete(blk, 41);
  rec->IoSubmit(blk, 42);
  ASSERT_TRUE(findings.WaitFor(FindingType::kAgedIo, 20s));
  // Many more polls, each seeing I/O 42 still in flight: still one report.
  ASSERT_TRUE(WaitForPolls(*rec, 20)) << "the watchdog stopped polling";
  const auto all = findings.All();
  ASSERT_EQ(findings.Count(FindingType::kAgedIo), 1u);
  EXPECT_EQ(all[0].io_id, 42u);
  EXPECT_EQ(all[0].device, blk);
  EXPECT_EQ(all[0].text.rfind("I/O 42 on vblk0 in flight for ", 0), 0u) << all[0].text;
  rec->IoComplete(blk, 42);
  EXPECT_EQ(rec->counters().io_in_flight, 0u);
  rec->StopWatchdog();
  EXPECT_FALSE(rec->watchdog_running());
}

}  // namespace
}  // namespace exitscope
