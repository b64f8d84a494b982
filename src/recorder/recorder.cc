// Recorder: creation, slow paths, device events, metadata and snapshots. The watchdog thread is
// in watchdog.cc, dump on signal in dump_signal.cc; their shared state is recorder_impl.h.
#include "exitscope/recorder.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "recorder/describe.h"
#include "recorder/exit_convert.h"
#include "recorder/recorder_impl.h"

namespace exitscope {

using internal::ClaimStallEnd;
using internal::ExitDescription;
using internal::ExitFinding;
using internal::ReadCurrent;
using internal::StallEndLine;

namespace {

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
  if (o.stacks.max_frames < 1 || o.stacks.max_frames > 256) {
    return bad("stacks.max_frames " + std::to_string(o.stacks.max_frames) +
               " is out of range (1..256)");
  }
  if (o.stacks.captures_per_stall < 1 || o.stacks.captures_per_stall > 8) {
    return bad("stacks.captures_per_stall " + std::to_string(o.stacks.captures_per_stall) +
               " is out of range (1..8)");
  }
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
  StopWatchdog();  // before the stack signal: the watchdog is what sends it
  RemoveStackSignal();
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

std::string ExitLinePrefix(const Recorder& rec, const ExitRecord& r) {
  return "vCPU " + std::to_string(r.vcpu) + ": " + ExitDescription(rec, r);
}

}  // namespace

namespace internal {

std::string ExitDescription(const Recorder& rec, const ExitRecord& r) {
  std::string device, reg;
  Names(rec, r, &device, &reg);
  return internal::DescribeExit(r.kind, r.dir, r.size, r.addr, device, reg);
}

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

bool ReadCurrent(const VcpuSlot& v, ExitRecord* out, uint64_t* exit_no) {
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

bool ClaimStallEnd(VcpuSlot& v, uint64_t exit_no) noexcept {
  uint64_t seen = v.end_claimed.load(std::memory_order_relaxed);
  while (seen < exit_no) {
    if (v.end_claimed.compare_exchange_weak(seen, exit_no, std::memory_order_acq_rel)) return true;
  }
  return false;
}

std::string StallEndLine(const std::string& prefix, uint64_t ns) {
  return prefix + " ended after " + FormatDurationNs(ns) + " (was stuck)";
}
}  // namespace internal

void Recorder::Resolve(ExitRecord* r) const noexcept {
  internal::ResolveIn(space_, r);
}

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
  if (log) {
    Log(f.text);
    // Then the stack, indented: frames innermost first, kernel frames above the user ones
    // (the kernel is where the thread is now).
    const ThreadStack& st = f.stack;
    if (!st.empty()) {
      std::string head = "    thread " + std::to_string(st.tid);
      if (st.state != 0) head += std::string(" state ") + st.state;
      head += ", capture " + std::to_string(st.capture);
      Log(head);
      for (const StackFrame& fr : st.kernel) Log("      k " + FormatFrame(fr));
      for (const StackFrame& fr : st.user) Log("      u " + FormatFrame(fr));
      if (st.user_dropped != 0) {
        Log("      (" + std::to_string(st.user_dropped) + " more user frames not kept)");
      }
    }
    if (!st.note.empty()) Log("    " + st.note);
  }
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

// ---- Snapshot ----------------------------------------------------------------------------

Dump Recorder::Snapshot(const DumpOptions& options) const {
  Dump d;
  Snapshot(options, &d);
  return d;
}

void Recorder::Snapshot(const DumpOptions& options, Dump* out) const {
  // Everything reset except the exit vectors' storage: a dump thread that keeps its Dump
  // touches the same memory next time instead of fresh pages.
  std::vector<DumpVcpu> kept = std::move(out->vcpus);
  *out = Dump{};
  Dump& d = *out;
  kept.resize(num_vcpus_);
  for (DumpVcpu& v : kept) {
    std::vector<DumpExit> exits = std::move(v.exits);
    exits.clear();
    v = DumpVcpu{};
    v.exits = std::move(exits);
  }
  d.vcpus = std::move(kept);
  std::map<const RegisterMap*, uint32_t> map_index;
  SnapshotMetadata(options, &d, &map_index);
  const uint64_t now_ticks = clock_.Now();
  internal::ExitConverter to_dump(clock_, space_, options.include_guest_data, &d, &map_index);

  // Each ring is copied a chunk at a time (the chunk stays in cache) and converted from it; the
  // counters are those of the instant the ring was copied (written = the head copied up to),
  // so written = exits + overwritten + this snapshot's skipped holds for every dump.
  constexpr size_t kChunk = 512;  // 28 KiB of records
  const std::unique_ptr<ExitRecord[]> chunk(new ExitRecord[kChunk]);
  for (uint32_t v = 0; v < num_vcpus_; ++v) {
    DumpVcpu& dv = d.vcpus[v];
    dv.vcpu = v;
    const ExitRing& ring = rings_.ring(v);
    const uint64_t max = options.max_exits_per_vcpu;
    uint64_t expect = std::min(ring.written() + kChunk, ring.capacity());
    if (max != 0) expect = std::min(expect, max);
    dv.exits.reserve(expect);
    const ExitRing::SnapshotStats st =
        ring.SnapshotChunked(max, chunk.get(), kChunk, [&](const ExitRecord* recs, size_t n) {
          for (size_t i = 0; i < n; ++i) to_dump(recs[i], &dv.exits.emplace_back());
        });
    dv.counters.capacity = ring.capacity();
    dv.counters.written = st.written;
    dv.counters.overwritten = st.written > ring.capacity() ? st.written - ring.capacity() : 0;
    dv.counters.skipped = ring.counters().skipped;
    ExitRecord cur;
    if (ReadInProgress(v, now_ticks, &cur)) to_dump(cur, &dv.in_progress.emplace());
  }
  SnapshotEvents(&d);
  d.counters = counters();
}

void Recorder::SnapshotMetadata(const DumpOptions& options, Dump* out,
                                std::map<const RegisterMap*, uint32_t>* map_index) const {
  Dump& d = *out;
  d.vcpus.resize(num_vcpus_);
  for (uint32_t v = 0; v < num_vcpus_; ++v) {
    d.vcpus[v].vcpu = v;
    d.vcpus[v].tid = slots_[v].tid.load(std::memory_order_relaxed);
  }
  d.stack_counters = impl_->stacks.counters();
  d.version = kDumpVersion;
  d.includes_guest_data = options.include_guest_data;
  d.monotonic_ns = Clock::MonotonicNs();
  d.realtime_ns = RealtimeNs();
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
  for (const RangeInfo& r : space_.Ranges()) {
    DumpRange dr;
    dr.space = r.space;
    dr.base = r.base;
    dr.size = r.size;
    dr.device = r.device;
    if (r.map) {
      auto [it, inserted] = map_index->emplace(r.map.get(), static_cast<uint32_t>(d.maps.size()));
      if (inserted) d.maps.push_back(*r.map);
      dr.map = it->second;
    }
    d.ranges.push_back(dr);
  }
}

bool Recorder::ReadInProgress(uint32_t vcpu, uint64_t now_ticks, ExitRecord* out) const {
  uint64_t no = 0;
  if (!ReadCurrent(slots_[vcpu], out, &no)) return false;
  out->duration_ticks = now_ticks > out->start_ticks ? now_ticks - out->start_ticks : 0;
  if (slots_[vcpu].stalled.load(std::memory_order_relaxed) == no) out->flags |= kExitFlagStalled;
  return true;
}

void Recorder::SnapshotEvents(Dump* out) const {
  Dump& d = *out;
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
}

}  // namespace exitscope
