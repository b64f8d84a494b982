// The watchdog thread: reports vCPUs stuck inside an exit (and the end of each stall), and I/Os
// in flight for too long. It reads the in-progress slots under their seqlock and never stops a
// vCPU.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "exitscope/recorder.h"
#include "recorder/recorder_impl.h"

namespace exitscope {

using internal::ClaimStallEnd;
using internal::ExitDescription;
using internal::ExitFinding;
using internal::ReadCurrent;
using internal::StallEndLine;

class Watchdog {
 public:
  static void Run(Recorder* rec) {
    Recorder::Impl& im = *rec->impl_;
    WatchdogOptions o;
    {
      std::lock_guard<std::mutex> lock(im.wd_mu);
      o = im.wd_options;
    }
    uint64_t poll = o.poll_ns;
    if (poll == 0) poll = std::min<uint64_t>(10'000'000, o.stuck_exit_ns / 4);
    poll = std::max<uint64_t>(poll, 1'000'000);
    const uint64_t stuck_ticks = rec->clock_.NsToTicks(o.stuck_exit_ns);
    const uint64_t io_ticks = rec->clock_.NsToTicks(o.io_age_ns);
    std::vector<Stall> stalls(rec->num_vcpus_);
    std::vector<InflightIoTable::Entry> aged;
    std::unique_lock<std::mutex> lock(im.wd_mu);
    while (!im.wd_stop) {
      im.wd_cv.wait_for(lock, std::chrono::nanoseconds(poll));
      if (im.wd_stop) break;
      lock.unlock();
      Poll(rec, stuck_ticks, io_ticks, &stalls, &aged);
      im.wd_polls.fetch_add(1, std::memory_order_release);
      lock.lock();
    }
    lock.unlock();
    // Stalls that ended since the last poll still get their end finding.
    for (uint32_t v = 0; v < rec->num_vcpus_; ++v) EndStall(rec, v, &stalls[v]);
  }

 private:
  // The exit a vCPU was reported stuck in, until its end finding is out.
  struct Stall {
    uint64_t exit_no = 0;   // 0: none pending
    ExitRecord record;      // resolved, as reported
    uint64_t seen_ns = 0;   // how long it had been inside when reported
    uint32_t captures = 0;  // stack captures made of this stall
    ThreadStack last;       // the latest of them
  };

  // A capture of vCPU `v`'s thread inside exit `no` (empty when captures are off).
  static ThreadStack CaptureStack(Recorder* rec, uint32_t v, uint64_t no, Stall* stall) {
    internal::StackSampler& sampler = rec->impl_->stacks;
    const int32_t tid = rec->slots_[v].tid.load(std::memory_order_relaxed);
    if (!sampler.enabled() || tid == 0) {
      sampler.CountSkipped();
      return {};
    }
    return sampler.Capture(v, rec->slots_[v], tid, no, ++stall->captures);
  }

  // Captures a stall again at 4x, 16x... the threshold while the vCPU stays inside it.
  static void Recapture(Recorder* rec, uint32_t v, uint64_t elapsed_ticks, uint64_t stuck_ticks,
                        Stall* stall) {
    const uint32_t limit = rec->impl_->stacks.options().captures_per_stall;
    if (stall->captures == 0 || stall->captures >= limit) return;
    const uint64_t due = stuck_ticks << (2 * stall->captures);
    if ((due >> (2 * stall->captures)) != stuck_ticks || elapsed_ticks < due) return;
    const uint64_t ns = rec->clock_.TicksToNs(elapsed_ticks);
    ThreadStack st = CaptureStack(rec, v, stall->exit_no, stall);
    if (st.empty() && st.note.empty()) return;
    FindingRecord f =
        ExitFinding(stall->record, FindingType::kStuckExitStack, Clock::MonotonicNs(), ns);
    f.vcpu = v;
    f.text = "vCPU " + std::to_string(v) + ": still stuck in " +
             ExitDescription(*rec, stall->record) + " for " + FormatDurationNs(ns) +
             " (stack capture " + std::to_string(st.capture) + " of " + std::to_string(limit) + ")";
    // A stack that has not changed is said in one line (a thread blocked in one call).
    const bool same = st.user == stall->last.user && st.kernel == stall->last.kernel &&
                      st.state == stall->last.state && !st.user.empty();
    const std::string same_line = "    thread " + std::to_string(st.tid) + ", capture " +
                                  std::to_string(st.capture) + ": the same stack as capture " +
                                  std::to_string(stall->last.capture);
    stall->last = st;
    f.stack = std::move(st);
    if (same) {
      rec->Log(f.text);
      rec->Log(same_line);
    }
    rec->AddFinding(std::move(f), !same);
  }

  // If the stalled exit has ended and the vCPU did not claim its end finding (it ended before
  // it could see the stall flag), emits the end finding here, with the duration from the ring.
  static void EndStall(Recorder* rec, uint32_t v, Stall* stall) {
    if (stall->exit_no == 0) return;
    internal::VcpuSlot& slot = rec->slots_[v];
    ExitRecord cur;
    uint64_t no = 0;
    if (ReadCurrent(slot, &cur, &no) && no == stall->exit_no) return;  // still inside
    if (slot.exit_no.load(std::memory_order_relaxed) == stall->exit_no &&
        slot.cur[0].load(std::memory_order_relaxed) != 0) {
      return;  // the seqlock was busy: look again next poll
    }
    if (slot.end_claimed.load(std::memory_order_acquire) >= stall->exit_no) {
      stall->exit_no = 0;  // the vCPU emitted it
      return;
    }
    // The vCPU clears its slot just before it appends the record: find the record first.
    const ExitRecord& r = stall->record;
    uint64_t ticks = 0;
    bool found = false, newer = false;
    std::vector<ExitRecord> recent;  // rare (the vCPU missed the flag): the whole ring
    rec->rings_.ring(v).Snapshot(&recent);
    for (auto it = recent.rbegin(); it != recent.rend() && !found; ++it) {
      found = it->start_ticks == r.start_ticks;
      if (found) ticks = it->duration_ticks;
      newer = newer || it->start_ticks > r.start_ticks;
    }
    if (!found && !newer) return;  // not appended yet: look again next poll
    const uint64_t exit_no = stall->exit_no;
    stall->exit_no = 0;
    if (!ClaimStallEnd(slot, exit_no)) return;  // the vCPU emitted it
    // Overwritten before the watchdog saw the end: the total is at least what it saw.
    const uint64_t ns = found ? rec->clock_.TicksToNs(ticks) : stall->seen_ns;
    FindingRecord f = ExitFinding(r, FindingType::kStuckExitEnd, Clock::MonotonicNs(), ns);
    f.vcpu = v;
    const std::string prefix = "vCPU " + std::to_string(v) + ": " + ExitDescription(*rec, r);
    f.text = found ? StallEndLine(prefix, ns)
                   : prefix + " ended after at least " + FormatDurationNs(ns) +
                         " (was stuck; its record was overwritten before the end was seen)";
    rec->AddFinding(std::move(f), true);
  }

  static void Poll(Recorder* rec, uint64_t stuck_ticks, uint64_t io_ticks,
                   std::vector<Stall>* stalls, std::vector<InflightIoTable::Entry>* aged) {
    const Clock& clock = rec->clock_;
    for (uint32_t v = 0; v < rec->num_vcpus_; ++v) {
      internal::VcpuSlot& slot = rec->slots_[v];
      Stall& stall = (*stalls)[v];
      EndStall(rec, v, &stall);
      // The clock is read before the slot: an exit seen in progress after `now` ends after it,
      // so the time reported "so far" never exceeds the exit's total.
      const uint64_t now = clock.Now();
      ExitRecord r;
      uint64_t no = 0;
      if (!ReadCurrent(slot, &r, &no)) continue;
      const uint64_t elapsed = now > r.start_ticks ? now - r.start_ticks : 0;
      if (no == stall.exit_no) {
        Recapture(rec, v, elapsed, stuck_ticks, &stall);
        continue;
      }
      // The previous stall's end is still out: its exit has ended, since the vCPU is in a
      // later one, so its record is in the ring now (appended before that BeginExit). Emit it
      // before `stall` is reused; if it still cannot be settled, the new exit waits a poll.
      EndStall(rec, v, &stall);
      if (stall.exit_no != 0) continue;
      if (no <= slot.stalled.load(std::memory_order_relaxed)) continue;
      if (elapsed < stuck_ticks) continue;
      rec->Resolve(&r);
      FindingRecord f = ExitFinding(r, FindingType::kStuckExitBegin, Clock::MonotonicNs(),
                                    clock.TicksToNs(elapsed));
      f.vcpu = v;
      f.text = "vCPU " + std::to_string(v) + ": stuck in " + ExitDescription(*rec, r) + " for " +
               FormatDurationNs(f.duration_ns) + " (still inside)";
      // The flag first (a snapshot taken once the finding is out shows the exit stalled),
      // then the finding, then `begin_reported`: the vCPU emits the end only after that; if it
      // ends earlier, or before it can see the flag, the next poll's EndStall emits the end.
      stall.seen_ns = f.duration_ns;
      stall.exit_no = no;
      stall.record = r;
      stall.captures = 0;
      slot.stalled.store(no, std::memory_order_release);
      f.stack = CaptureStack(rec, v, no, &stall);
      stall.last = f.stack;
      rec->AddFinding(std::move(f), true);
      slot.begin_reported.store(no, std::memory_order_release);
    }
    if (io_ticks == 0) return;
    const uint64_t now = clock.Now();
    if (now <= io_ticks) return;
    aged->clear();
    rec->impl_->inflight.CollectAged(now - io_ticks, aged);
    for (const InflightIoTable::Entry& e : *aged) {
      FindingRecord f;
      f.time_ns = Clock::MonotonicNs();
      f.type = FindingType::kAgedIo;
      f.device = e.device;
      f.io_id = e.io_id;
      f.duration_ns = clock.TicksToNs(now > e.start_ticks ? now - e.start_ticks : 0);
      std::string dev = rec->address_space().DeviceName(e.device);
      if (dev.empty()) dev = "device " + std::to_string(e.device);
      f.text = "I/O " + std::to_string(e.io_id) + " on " + dev + " in flight for " +
               FormatDurationNs(f.duration_ns) + " (not completed)";
      rec->AddFinding(std::move(f));
    }
  }
};

Status Recorder::StartWatchdog(const WatchdogOptions& options) {
  if (options.stuck_exit_ns == 0) {
    return Fail(ErrorCode::kInvalidArgument, "watchdog stuck_exit_ns must be > 0");
  }
  StopWatchdog();
  {
    std::lock_guard<std::mutex> lock(impl_->wd_mu);
    impl_->wd_options = options;
    impl_->wd_stop = false;
  }
  try {
    impl_->wd_thread = std::thread(&Watchdog::Run, this);
  } catch (const std::system_error& e) {
    return Fail(ErrorCode::kInternal, std::string("cannot start the watchdog thread: ") + e.what());
  }
  impl_->wd_running.store(true);
  return {};
}

void Recorder::StopWatchdog() {
  {
    std::lock_guard<std::mutex> lock(impl_->wd_mu);
    impl_->wd_stop = true;
  }
  impl_->wd_cv.notify_all();
  if (impl_->wd_thread.joinable()) impl_->wd_thread.join();
  impl_->wd_running.store(false);
}

bool Recorder::watchdog_running() const noexcept {
  return impl_->wd_running.load();
}

uint64_t Recorder::watchdog_polls() const noexcept {
  return impl_->wd_polls.load(std::memory_order_acquire);
}
}  // namespace exitscope
