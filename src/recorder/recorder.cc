// Recorder: creation, slow paths, device events, watchdog thread, metadata, snapshots and the
// dump-on-signal thread.
#include "exitscope/recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <thread>

#include "recorder/describe.h"

namespace exitscope {

struct Recorder::Impl {
  Impl(const RecorderOptions& o)
      : options(o),
        device_events(o.device_events),
        inflight(o.inflight_ios),
        vcpu_counters(o.num_vcpus) {}

  RecorderOptions options;
  DeviceEventRing device_events;
  InflightIoTable inflight;

  mutable std::mutex mu;  // everything below that is not atomic
  std::deque<FindingRecord> findings;
  uint64_t findings_dropped = 0;
  SlowExitHook slow_hook;
  bool slow_log = true;
  LogSink sink;
  FindingHook finding_hook;
  std::map<std::string, std::string> attributes;
  std::vector<std::map<std::string, uint64_t>> vcpu_counters;

  std::atomic<uint64_t> bad_vcpu{0};
  std::atomic<uint64_t> end_without_begin{0};
  std::atomic<uint64_t> begin_without_end{0};
  std::atomic<uint64_t> slow_exits{0};

  // Watchdog.
  std::mutex wd_mu;
  std::condition_variable wd_cv;
  std::thread wd_thread;
  bool wd_stop = false;
  WatchdogOptions wd_options;
  std::atomic<bool> wd_running{false};

  // Dump on signal.
  std::mutex sig_mu;
  int sig_efd = -1;
  int sig_signo = 0;
  struct sigaction sig_old {};
  std::thread sig_thread;
  std::atomic<bool> sig_stop{false};
  std::string sig_dir;
  DumpOptions sig_options;
  std::string last_signal_dump;  // under mu
  uint64_t signal_dumps = 0;
};

namespace {

std::atomic<int> g_dump_efd{-1};

void DumpSignalHandler(int) {
  const int saved = errno;
  const int fd = g_dump_efd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof one);
    (void)n;
  }
  errno = saved;
}

uint64_t RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

Status CheckOptions(const RecorderOptions& o) {
  auto bad = [](const std::string& m) { return Fail(ErrorCode::kInvalidArgument, m); };
  if (o.num_vcpus < 1 || o.num_vcpus > 4096) {
    return bad("num_vcpus " + std::to_string(o.num_vcpus) + " is out of range (1..4096)");
  }
  if (o.events_per_vcpu < 2 || o.events_per_vcpu > (1ull << 24)) {
    return bad("events_per_vcpu " + std::to_string(o.events_per_vcpu) +
               " is out of range (2..16777216)");
  }
  if (o.device_events < 2 || o.device_events > (1ull << 24)) {
    return bad("device_events " + std::to_string(o.device_events) +
               " is out of range (2..16777216)");
  }
  if (o.findings < 1 || o.findings > 65536) {
    return bad("findings " + std::to_string(o.findings) + " is out of range (1..65536)");
  }
  if (o.inflight_ios < 16 || o.inflight_ios > (1u << 20)) {
    return bad("inflight_ios " + std::to_string(o.inflight_ios) + " is out of range (16..1048576)");
  }
  if (o.slow_exit.threshold_ns == 0) return bad("slow_exit.threshold_ns must be > 0");
  return {};
}

}  // namespace

Result<std::unique_ptr<Recorder>> Recorder::Create(const RecorderOptions& options) {
  EXITSCOPE_RETURN_IF_ERROR(CheckOptions(options));
  std::unique_ptr<Recorder> r(new Recorder(options));
  if (options.start_watchdog) {
    EXITSCOPE_RETURN_IF_ERROR(r->StartWatchdog(options.watchdog));
  }
  return r;
}

Recorder::Recorder(const RecorderOptions& options)
    : num_vcpus_(options.num_vcpus),
      clock_(Clock::Create(options.clock)),
      slots_(new internal::VcpuSlot[options.num_vcpus]),
      rings_(options.num_vcpus, options.events_per_vcpu),
      impl_(std::make_unique<Impl>(options)) {
  for (uint32_t i = 0; i < num_vcpus_; ++i) {
    for (auto& w : slots_[i].cur) w.store(0, std::memory_order_relaxed);
  }
  SetSlowExitPolicy(options.slow_exit);
}

Recorder::~Recorder() {
  RemoveDumpSignal();
  StopWatchdog();
}

// ---- Slow paths --------------------------------------------------------------------------

void Recorder::CountBadVcpu() noexcept {
  impl_->bad_vcpu.fetch_add(1, std::memory_order_relaxed);
}
void Recorder::EndWithoutBegin() noexcept {
  impl_->end_without_begin.fetch_add(1, std::memory_order_relaxed);
}

void Recorder::BeginWithoutEnd(uint32_t vcpu, uint64_t now) noexcept {
  impl_->begin_without_end.fetch_add(1, std::memory_order_relaxed);
  internal::VcpuSlot& v = slots_[vcpu];
  uint64_t w[internal::VcpuSlot::kWords];
  for (int i = 0; i < internal::VcpuSlot::kWords; ++i)
    w[i] = v.cur[i].load(std::memory_order_relaxed);
  ExitRecord r;
  std::memcpy(&r, w, sizeof r);
  r.duration_ticks = now - r.start_ticks;
  r.flags |= kExitFlagNoEnd;
  const bool stalled = v.stalled.load(std::memory_order_relaxed) == v.begins;
  if (stalled) r.flags |= kExitFlagStalled;
  if (r.duration_ticks >= slow_ticks_.load(std::memory_order_relaxed)) r.flags |= kExitFlagSlow;
  rings_.ring(vcpu).Write(r);
  if ((r.flags & (kExitFlagSlow | kExitFlagStalled)) != 0) SlowPath(r, stalled ? v.begins : 0);
}

namespace {
// Device and register names of a record, from the live address space.
void Names(const Recorder& rec, const ExitRecord& r, std::string* device, std::string* reg) {
  *device = rec.address_space().DeviceName(r.device);
  reg->clear();
  if (r.kind != ExitKind::kMmio && r.kind != ExitKind::kPio) return;
  const Resolution res = rec.address_space().Lookup(SpaceOf(r.kind), r.addr, r.size, r.dir);
  if (res.device == r.device && res.map != nullptr) {
    *reg = res.map->Format(RegisterHit{r.reg, r.reg_element, r.reg_delta}, r.size);
  }
}

// "exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008)" for a resolved record.
std::string ExitDescription(const Recorder& rec, const ExitRecord& r) {
  std::string device, reg;
  Names(rec, r, &device, &reg);
  return internal::DescribeExit(r.kind, r.dir, r.size, r.addr, device, reg);
}

std::string ExitLinePrefix(const Recorder& rec, const ExitRecord& r) {
  return "vCPU " + std::to_string(r.vcpu) + ": " + ExitDescription(rec, r);
}

// A finding about the (resolved) exit `r`, without its text.
FindingRecord ExitFinding(const ExitRecord& r, FindingType type, uint64_t now_ns,
                          uint64_t duration_ns) {
  FindingRecord f;
  f.time_ns = now_ns;
  f.type = type;
  f.vcpu = r.vcpu;
  f.duration_ns = duration_ns;
  f.kind = r.kind;
  f.dir = r.dir;
  f.size = r.size;
  f.addr = r.addr;
  f.device = r.device;
  f.reg = r.reg;
  f.reg_element = r.reg_element;
  f.reg_delta = r.reg_delta;
  return f;
}
}  // namespace

void Recorder::Resolve(ExitRecord* r) const noexcept {
  if ((r->flags & kExitFlagUnresolved) == 0) return;
  const Resolution res = space_.LookupAt(r->device, SpaceOf(r->kind), r->addr, r->size, r->dir);
  r->device = res.device;
  r->reg = res.reg.reg;
  r->reg_element = res.reg.element;
  r->reg_delta = res.reg.delta;
  r->flags &= static_cast<uint8_t>(~kExitFlagUnresolved);
}

namespace {
// Claims the right to emit the end finding of stall `exit_no` (one end per stall, whoever sees
// the end first: the vCPU's slow path or the watchdog). Claims only grow.
bool ClaimStallEnd(internal::VcpuSlot& v, uint64_t exit_no) noexcept {
  uint64_t seen = v.end_claimed.load(std::memory_order_relaxed);
  while (seen < exit_no) {
    if (v.end_claimed.compare_exchange_weak(seen, exit_no, std::memory_order_acq_rel)) return true;
  }
  return false;
}

std::string StallEndLine(const std::string& prefix, uint64_t ns) {
  return prefix + " ended after " + FormatDurationNs(ns) + " (was stuck)";
}
}  // namespace

void Recorder::SlowPath(const ExitRecord& unresolved, uint64_t stalled_exit_no) noexcept {
  ExitRecord r = unresolved;
  Resolve(&r);
  try {
    const uint64_t ns = clock_.TicksToNs(r.duration_ticks);
    const uint64_t now_ns = Clock::MonotonicNs();
    const std::string prefix = ExitLinePrefix(*this, r);
    FindingRecord f = ExitFinding(r, FindingType::kSlowExit, now_ns, ns);
    const bool stalled = stalled_exit_no != 0;
    // The end is ours only once the stuck finding is out (an end never precedes its begin);
    // else the watchdog's next poll emits it.
    internal::VcpuSlot& slot = slots_[r.vcpu];
    if (stalled && slot.begin_reported.load(std::memory_order_acquire) >= stalled_exit_no &&
        ClaimStallEnd(slot, stalled_exit_no)) {
      FindingRecord end = f;
      end.type = FindingType::kStuckExitEnd;
      end.text = StallEndLine(prefix, ns);
      AddFinding(std::move(end), true);
    }
    if ((r.flags & kExitFlagSlow) != 0) {
      impl_->slow_exits.fetch_add(1, std::memory_order_relaxed);
      SlowExitHook hook;
      bool log;
      {
        std::lock_guard<std::mutex> lock(impl_->mu);
        hook = impl_->slow_hook;
        log = impl_->slow_log;
      }
      SlowExit s;
      s.record = r;
      s.duration_ns = ns;
      Names(*this, r, &s.device, &s.reg);
      s.line = prefix + " took " + FormatDurationNs(ns);
      f.text = s.line;
      if (hook) hook(s);
      // A stuck exit has logged "stuck" and "ended after" (with the total): the slow-exit
      // finding is kept and reaches the hook, but is not logged a third time.
      AddFinding(std::move(f), log && !stalled);
    }
  } catch (...) {
    // Out of memory in the slow path: the record is already in the ring; drop the report.
  }
}

void Recorder::AddFinding(FindingRecord f) {
  AddFinding(std::move(f), true);
}

void Recorder::AddFinding(FindingRecord f, bool log) {
  FindingHook hook;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    hook = impl_->finding_hook;
    if (impl_->findings.size() >= impl_->options.findings) {
      impl_->findings.pop_front();
      ++impl_->findings_dropped;
    }
    impl_->findings.push_back(f);
  }
  if (log) Log(f.text);
  if (hook) hook(f);
}

void Recorder::Log(std::string_view line) const {
  LogSink sink;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    sink = impl_->sink;
  }
  if (sink) {
    sink(line);
  } else {
    std::string s(line);
    s += '\n';
    (void)!write(STDERR_FILENO, s.data(), s.size());
  }
}

// ---- Device events -----------------------------------------------------------------------

uint64_t Recorder::WriteDeviceEvent(DeviceEventType type, uint32_t device, uint64_t io_id,
                                    int64_t status, std::string_view note) noexcept {
  DeviceEventRecord e;
  e.time_ticks = clock_.Now();
  e.type = type;
  e.device = device;
  e.io_id = io_id;
  e.status = status;
  e.SetNote(note);
  impl_->device_events.Write(e);
  return e.time_ticks;
}

void Recorder::IoSubmit(uint32_t device, uint64_t io_id) noexcept {
  const uint64_t now = WriteDeviceEvent(DeviceEventType::kIoSubmit, device, io_id, 0, {});
  impl_->inflight.Submit(device, io_id, now);
}

void Recorder::IoComplete(uint32_t device, uint64_t io_id, int64_t status) noexcept {
  WriteDeviceEvent(DeviceEventType::kIoComplete, device, io_id, status, {});
  impl_->inflight.Complete(device, io_id);
}

void Recorder::QueueFull(uint32_t device, uint64_t queue) noexcept {
  WriteDeviceEvent(DeviceEventType::kQueueFull, device, queue, 0, {});
}

void Recorder::BackendError(uint32_t device, int64_t error, std::string_view note) noexcept {
  WriteDeviceEvent(DeviceEventType::kBackendError, device, 0, error, note);
}

void Recorder::Note(uint32_t device, std::string_view text) noexcept {
  WriteDeviceEvent(DeviceEventType::kNote, device, 0, 0, text);
}

// ---- Policy and metadata -----------------------------------------------------------------

void Recorder::SetSlowExitPolicy(SlowExitPolicy policy) {
  const uint64_t ns = policy.threshold_ns == 0 ? 1 : policy.threshold_ns;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->options.slow_exit.threshold_ns = ns;
    impl_->slow_hook = std::move(policy.hook);
    impl_->slow_log = policy.log;
  }
  uint64_t ticks = clock_.NsToTicks(ns);
  slow_ticks_.store(ticks == 0 ? 1 : ticks, std::memory_order_relaxed);
}

uint64_t Recorder::slow_exit_threshold_ns() const noexcept {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->options.slow_exit.threshold_ns;
}

void Recorder::SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->sink = std::move(sink);
}

void Recorder::SetFindingHook(FindingHook hook) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->finding_hook = std::move(hook);
}

void Recorder::SetAttribute(std::string key, std::string value) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->attributes[std::move(key)] = std::move(value);
}

Status Recorder::SetVcpuCounter(uint32_t vcpu, std::string name, uint64_t value) {
  if (vcpu >= num_vcpus_) {
    return Fail(ErrorCode::kInvalidArgument, "vCPU " + std::to_string(vcpu) +
                                                 " is out of range (recorder has " +
                                                 std::to_string(num_vcpus_) + ")");
  }
  if (name.empty()) return Fail(ErrorCode::kInvalidArgument, "counter name is empty");
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->vcpu_counters[vcpu][std::move(name)] = value;
  return {};
}

RingCounters Recorder::ring_counters(uint32_t vcpu) const noexcept {
  if (vcpu >= num_vcpus_) return {};
  return rings_.ring(vcpu).counters();
}

DeviceEventCounters Recorder::device_event_counters() const noexcept {
  return impl_->device_events.counters();
}

RecorderCounters Recorder::counters() const noexcept {
  RecorderCounters c;
  c.bad_vcpu = impl_->bad_vcpu.load(std::memory_order_relaxed);
  c.end_without_begin = impl_->end_without_begin.load(std::memory_order_relaxed);
  c.begin_without_end = impl_->begin_without_end.load(std::memory_order_relaxed);
  c.slow_exits = impl_->slow_exits.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    c.findings_dropped = impl_->findings_dropped;
  }
  c.io_inflight_overflow = impl_->inflight.overflow();
  c.io_untracked_completions = impl_->inflight.untracked();
  c.io_in_flight = impl_->inflight.in_flight();
  return c;
}

std::vector<FindingRecord> Recorder::Findings() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return {impl_->findings.begin(), impl_->findings.end()};
}

// ---- Watchdog ----------------------------------------------------------------------------

namespace {
// Reads the in-progress exit of a vCPU slot under its seqlock. False when none or when the
// slot kept changing.
bool ReadCurrent(const internal::VcpuSlot& v, ExitRecord* out, uint64_t* exit_no) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const uint64_t s1 = v.seq.load(std::memory_order_acquire);
    if ((s1 & 1) != 0) continue;
    uint64_t w[internal::VcpuSlot::kWords];
    for (int i = 0; i < internal::VcpuSlot::kWords; ++i)
      w[i] = v.cur[i].load(std::memory_order_relaxed);
    const uint64_t no = v.exit_no.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (v.seq.load(std::memory_order_relaxed) != s1) continue;
    std::memcpy(out, w, sizeof *out);
    *exit_no = no;
    return out->start_ticks != 0;
  }
  return false;
}
}  // namespace

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
      lock.lock();
    }
    lock.unlock();
    // Stalls that ended since the last poll still get their end finding.
    for (uint32_t v = 0; v < rec->num_vcpus_; ++v) EndStall(rec, v, &stalls[v]);
  }

 private:
  // The exit a vCPU was reported stuck in, until its end finding is out.
  struct Stall {
    uint64_t exit_no = 0;  // 0: none pending
    ExitRecord record;     // resolved, as reported
    uint64_t seen_ns = 0;  // how long it had been inside when reported
  };

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
      if (no == stall.exit_no || no <= slot.stalled.load(std::memory_order_relaxed)) continue;
      const uint64_t elapsed = now > r.start_ticks ? now - r.start_ticks : 0;
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
      slot.stalled.store(no, std::memory_order_release);
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

// ---- Snapshot ----------------------------------------------------------------------------

Dump Recorder::Snapshot(const DumpOptions& options) const {
  Dump d;
  d.version = kDumpVersion;
  d.includes_guest_data = options.include_guest_data;
  d.monotonic_ns = Clock::MonotonicNs();
  d.realtime_ns = RealtimeNs();
  const uint64_t now_ticks = clock_.Now();
  d.clock = clock_.calibration();
  d.process = internal::ReadProcessInfo();
  d.host = internal::ReadHostInfo();
  {
    std::lock_guard<std::mutex> lock(impl_->wd_mu);
    d.watchdog = impl_->wd_options;
  }
  d.watchdog_running = watchdog_running();

  // Address space.
  d.devices = space_.Devices();
  std::map<const RegisterMap*, uint32_t> map_index;
  for (const RangeInfo& r : space_.Ranges()) {
    DumpRange dr;
    dr.space = r.space;
    dr.base = r.base;
    dr.size = r.size;
    dr.device = r.device;
    if (r.map) {
      auto [it, inserted] = map_index.emplace(r.map.get(), static_cast<uint32_t>(d.maps.size()));
      if (inserted) d.maps.push_back(*r.map);
      dr.map = it->second;
    }
    d.ranges.push_back(dr);
  }

  auto to_dump = [&](ExitRecord r) {
    Resolve(&r);
    DumpExit e;
    e.start_ns = clock_.ToMonotonicNs(r.start_ticks);
    e.duration_ns = clock_.TicksToNs(r.duration_ticks);
    e.addr = r.addr;
    e.vcpu = r.vcpu;
    e.device = r.device;
    e.reg = r.reg;
    e.reg_element = r.reg_element;
    e.reg_delta = r.reg_delta;
    e.kind = r.kind;
    e.size = r.size;
    e.dir = r.dir;
    e.flags = r.flags;
    if (options.include_guest_data) {
      e.value = r.value;
    } else {
      e.flags &= static_cast<uint8_t>(~kExitFlagValue);
    }
    return e;
  };

  std::vector<ExitRecord> recs;
  for (uint32_t v = 0; v < num_vcpus_; ++v) {
    DumpVcpu dv;
    dv.vcpu = v;
    recs.clear();
    rings_.ring(v).SnapshotNewest(options.max_exits_per_vcpu, &recs);
    dv.counters = rings_.ring(v).counters();
    dv.exits.reserve(recs.size());
    for (const ExitRecord& r : recs) dv.exits.push_back(to_dump(r));
    ExitRecord cur;
    uint64_t no = 0;
    if (ReadCurrent(slots_[v], &cur, &no)) {
      cur.duration_ticks = now_ticks > cur.start_ticks ? now_ticks - cur.start_ticks : 0;
      if (slots_[v].stalled.load(std::memory_order_relaxed) == no) cur.flags |= kExitFlagStalled;
      dv.in_progress = to_dump(cur);
    }
    d.vcpus.push_back(std::move(dv));
  }

  std::vector<DeviceEventRecord> evs;
  impl_->device_events.Snapshot(&evs);
  d.device_event_counters = impl_->device_events.counters();
  for (const DeviceEventRecord& r : evs) {
    DumpDeviceEvent e;
    e.time_ns = clock_.ToMonotonicNs(r.time_ticks);
    e.type = r.type;
    e.device = r.device;
    e.io_id = r.io_id;
    e.status = r.status;
    e.note = std::string(r.text());
    e.note_truncated = r.truncated != 0;
    d.device_events.push_back(std::move(e));
  }

  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    d.slow_exit_threshold_ns = impl_->options.slow_exit.threshold_ns;
    d.findings.assign(impl_->findings.begin(), impl_->findings.end());
    d.attributes.assign(impl_->attributes.begin(), impl_->attributes.end());
    for (uint32_t v = 0; v < num_vcpus_; ++v) d.vcpus[v].named_counters = impl_->vcpu_counters[v];
  }
  d.counters = counters();
  return d;
}

Status Recorder::WriteDump(const std::string& path, const DumpOptions& options) const {
  return WriteDumpFile(Snapshot(options), path, options);
}

// ---- Dump on signal ----------------------------------------------------------------------
//
// The handler writes to one process-wide eventfd that is never closed (so a late signal can
// never write into a recycled descriptor). The owning recorder's thread polls that eventfd
// and its own stop eventfd.

namespace {
std::mutex g_sig_mu;
const Recorder* g_sig_owner = nullptr;  // under g_sig_mu

int GlobalDumpEventFd() {
  static const int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return fd;
}
}  // namespace

class DumpSignalThread {
 public:
  static void Run(Recorder* rec, int stop_fd) {
    Recorder::Impl& im = *rec->impl_;
    const int efd = GlobalDumpEventFd();
    for (;;) {
      pollfd fds[2] = {{efd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
      const int n = poll(fds, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        rec->Log("exitscope: dump signal thread: poll failed: " +
                 std::string(std::strerror(errno)));
        return;
      }
      if (im.sig_stop.load() || (fds[1].revents & POLLIN) != 0) return;
      uint64_t count = 0;
      if (read(efd, &count, sizeof count) != static_cast<ssize_t>(sizeof count)) continue;
      WriteOne(rec);
    }
  }

 private:
  static void WriteOne(Recorder* rec) {
    Recorder::Impl& im = *rec->impl_;
    std::string dir;
    DumpOptions opts;
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(im.sig_mu);
      dir = im.sig_dir;
      opts = im.sig_options;
    }
    {
      std::lock_guard<std::mutex> lock(im.mu);
      seq = ++im.signal_dumps;
    }
    std::string comm = internal::ReadProcessInfo().comm;
    for (char& c : comm) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-';
      if (!ok) c = '_';
    }
    if (comm.empty()) comm = "vmm";
    const time_t t = time(nullptr);
    struct tm tmv;
    gmtime_r(&t, &tmv);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%S", &tmv);
    const std::string path = dir + "/exitscope-" + comm + "-" + std::to_string(getpid()) + "-" +
                             stamp + "-" + std::to_string(seq) + ".esdump";
    Status s = rec->WriteDump(path, opts);
    if (s) {
      {
        std::lock_guard<std::mutex> lock(im.mu);
        im.last_signal_dump = path;
      }
      rec->Log("exitscope: wrote dump " + path);
    } else {
      rec->Log("exitscope: dump on signal failed: " + s.error().message);
    }
  }
};

Status Recorder::InstallDumpSignal(int signo, std::string directory, DumpOptions options) {
  if (signo <= 0 || signo >= NSIG || signo == SIGKILL || signo == SIGSTOP) {
    return Fail(ErrorCode::kInvalidArgument,
                "signal " + std::to_string(signo) + " cannot be used to request dumps");
  }
  // Synchronous fault signals: the kernel raises them on the faulting instruction, and a
  // handler that returns re-executes it (a loop, or a lost crash). Never ours to take.
  if (signo == SIGSEGV || signo == SIGBUS || signo == SIGFPE || signo == SIGILL ||
      signo == SIGTRAP || signo == SIGSYS || signo == SIGABRT) {
    return Fail(ErrorCode::kInvalidArgument,
                "signal " + std::to_string(signo) + " (" + strsignal(signo) +
                    ") is a synchronous fault signal; use e.g. SIGUSR1 to request dumps");
  }
  struct stat st;
  if (stat(directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Fail(ErrorCode::kInvalidArgument, directory + ": not a directory");
  }
  if (GlobalDumpEventFd() < 0) {
    return Fail(ErrorCode::kIo, std::string("eventfd: ") + std::strerror(errno));
  }
  RemoveDumpSignal();
  std::lock_guard<std::mutex> glock(g_sig_mu);
  if (g_sig_owner != nullptr && g_sig_owner != this) {
    return Fail(ErrorCode::kAlreadyExists,
                "another recorder in this process already owns the dump signal");
  }
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.sig_mu);
  const int stop_fd = eventfd(0, EFD_CLOEXEC);
  if (stop_fd < 0) return Fail(ErrorCode::kIo, std::string("eventfd: ") + std::strerror(errno));
  im.sig_efd = stop_fd;
  im.sig_dir = std::move(directory);
  im.sig_options = options;
  im.sig_stop.store(false);
  try {
    im.sig_thread = std::thread(&DumpSignalThread::Run, this, stop_fd);
  } catch (const std::system_error& e) {
    close(stop_fd);
    im.sig_efd = -1;
    return Fail(ErrorCode::kInternal, std::string("cannot start the dump thread: ") + e.what());
  }
  g_dump_efd.store(GlobalDumpEventFd());
  struct sigaction sa {};
  sa.sa_handler = &DumpSignalHandler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(signo, &sa, &im.sig_old) != 0) {
    const int err = errno;
    im.sig_stop.store(true);
    const uint64_t one = 1;
    (void)!write(stop_fd, &one, sizeof one);
    im.sig_thread.join();
    close(stop_fd);
    im.sig_efd = -1;
    return Fail(ErrorCode::kIo, "sigaction(" + std::to_string(signo) + "): " + std::strerror(err));
  }
  im.sig_signo = signo;
  g_sig_owner = this;
  return {};
}

void Recorder::RemoveDumpSignal() {
  std::lock_guard<std::mutex> glock(g_sig_mu);
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.sig_mu);
  if (im.sig_efd < 0) return;
  sigaction(im.sig_signo, &im.sig_old, nullptr);
  if (g_sig_owner == this) g_sig_owner = nullptr;
  im.sig_stop.store(true);
  const uint64_t one = 1;
  (void)!write(im.sig_efd, &one, sizeof one);
  if (im.sig_thread.joinable()) im.sig_thread.join();
  close(im.sig_efd);
  im.sig_efd = -1;
  im.sig_signo = 0;
}

std::string Recorder::last_signal_dump() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last_signal_dump;
}

}  // namespace exitscope
