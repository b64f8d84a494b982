// exitscope/recorder.h: the facade a VMM embeds. One Recorder per VM.
//
// It owns the address space (devices, ranges, register maps), one flight-recorder ring per
// vCPU, the device-event ring, the in-flight I/O table, the findings ring and the watchdog
// thread, and produces snapshots and dump files.
//
//   auto rec = exitscope::Recorder::Create({.num_vcpus = 4, .events_per_vcpu = 8192});
//   if (!rec) { fprintf(stderr, "%s\n", rec.error().message.c_str()); return 1; }
//   exitscope::Recorder& r = **rec;
//   uint32_t nvme = *r.address_space().AddDevice({.name = "nvme0", .kind = "nvme"});
//   (void)r.address_space().AddRange(exitscope::IoSpace::kMmio, 0xfebf0000, 0x4000, nvme,
//                                    *exitscope::RegisterMap::Builtin("nvme"));
//   (void)r.InstallDumpSignal(SIGUSR1, "/var/tmp");
//   // vCPU loop, on KVM_EXIT_MMIO:
//   r.BeginExit(vcpu, exitscope::ExitKind::kMmio, run->mmio.phys_addr, run->mmio.len,
//               run->mmio.is_write ? exitscope::AccessDir::kWrite : exitscope::AccessDir::kRead,
//               value_written);
//   HandleMmio(...);
//   r.EndExit(vcpu, value_read);   // or EndExit(vcpu) to keep the begin value
//
// Hot path (BeginExit / EndExit / ExitScope): inline, noexcept, no lock, no allocation, no
// syscall with the TSC clock (but one gettid, out of line, on a vCPU's first exit when no
// SetThreadId came before). It bails out first on a bad vCPU index (counted). One thread per
// vCPU index at a time (the vCPU thread) may call them. Everything else is thread-safe.
//
// Slow exits: when EndExit finds duration >= SlowExitPolicy::threshold_ns it leaves the hot
// path (out of line): calls the hook, logs one line such as
//   vCPU 4: exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008) took 22.31 s
// through the log sink (default: stderr) and adds a kSlowExit finding.
// An exit the watchdog saw stuck logs two lines in all: "stuck in ... (still inside)" while it
// is stuck, and "... ended after 22.31 s (was stuck)" when it ends; its kSlowExit finding is
// kept (ring, hook, dump) but not logged a third time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "exitscope/address_space.h"
#include "exitscope/clock.h"
#include "exitscope/device_events.h"
#include "exitscope/dump.h"
#include "exitscope/exit_record.h"
#include "exitscope/export.h"
#include "exitscope/flight_recorder.h"
#include "exitscope/status.h"
#include "exitscope/watchdog.h"

namespace exitscope {

// A slow exit, as passed to the SlowExitPolicy hook (on the vCPU thread, after the exit ended).
struct SlowExit {
  ExitRecord record;
  uint64_t duration_ns = 0;
  std::string device;  // "nvme0", "" when unassigned
  std::string reg;     // "SQ1TDBL", "" when none
  std::string line;    // the log line (without newline)
};
using SlowExitHook = std::function<void(const SlowExit&)>;

struct SlowExitPolicy {
  uint64_t threshold_ns = 20'000'000;  // 20 ms
  SlowExitHook hook{};                 // optional
  bool log = true;                     // log the line through the log sink
};

// Receives complete log lines without the trailing newline. Called from vCPU threads (slow
// exits), the watchdog thread and the dump thread; must be thread-safe.
using LogSink = std::function<void(std::string_view line)>;

struct RecorderOptions {
  uint32_t num_vcpus = 1;           // 1..4096
  uint64_t events_per_vcpu = 4096;  // ring capacity, rounded up to a power of two (2..2^24)
  uint64_t device_events = 4096;    // device-event ring capacity (power of two, 2..2^24)
  uint32_t findings = 256;          // findings ring capacity (1..65536)
  uint32_t inflight_ios = 1024;     // in-flight I/O table capacity (16..2^20)
  ClockChoice clock = ClockChoice::kAuto;
  SlowExitPolicy slow_exit{};
  WatchdogOptions watchdog{};
  StackOptions stacks{};       // stack captures of stuck vCPU threads (watchdog.h, stack.h)
  bool start_watchdog = true;  // start the watchdog thread in Create
};

namespace internal {
// Per-vCPU in-progress slot: the exit a vCPU is inside now, readable by the watchdog and by
// snapshots while the vCPU is stuck in it.
//
// Memory (one per vCPU, allocated at creation, two cache lines):
//
//   +-------------+--------------------------------------+---------+---------+-------------+
//   | seq (atomic)| cur[0..6]: the ExitRecord's 7 words  | exit_no | stalled | end_claimed |
//   +-------------+--------------------------------------+---------+---------+-------------+
//   | begin_reported | begins (vCPU thread only) |
//   +----------------+---------------------------+
//
// States: cur[0] (= start_ticks) == 0 means "no exit in progress" (Idle); != 0 means Inside.
//
//               BeginExit: seq odd -> cur[0..6] -> exit_no -> seq even
//     Idle ---------------------------------------------------------------> Inside
//       ^                                                                     |
//       |  EndExit: seq odd -> cur[0] = 0 -> seq even, THEN the record goes    |
//       |  to the ring (so a reader never sees the exit both in progress and   |
//       +--- in the ring)  ---------------------------------------------------+
//
// A BeginExit while Inside first writes the previous exit to the ring with kExitFlagNoEnd.
// Owners: the vCPU thread is the only writer of seq, cur, exit_no and begins (one thread per
// vCPU index at a time). Readers (watchdog, Snapshot) copy cur and exit_no between two loads of
// seq and keep the copy only if both saw the same even value (a seqlock; Recorder's
// ReadCurrent retries a few times and gives up rather than wait).
//
// The stall protocol (a stuck exit gets exactly one "stuck" and one "ended" finding):
//   stalled        written by the watchdog: exit_no of the exit it found stuck (release), read
//                  by EndExit to flag the record kExitFlagStalled;
//   begin_reported written by the watchdog after its "stuck" finding is out;
//   end_claimed    compare-and-swap by whoever sees the end first (the vCPU's slow path if
//                  begin_reported already covers the exit, else the watchdog's next poll);
//                  only grows, so the end finding is emitted once.
struct alignas(64) VcpuSlot {
  static constexpr int kWords = sizeof(ExitRecord) / sizeof(uint64_t);
  std::atomic<uint64_t> seq{0};
  std::atomic<uint64_t> cur[kWords];
  std::atomic<uint64_t> exit_no{0};  // number of BeginExit calls so far (identifies a stall)
  std::atomic<uint64_t> stalled{0};  // exit_no of the exit the watchdog reported as stuck
  // exit_no of the last stall whose end finding was claimed (compare-and-swap, by the vCPU's
  // slow path or by the watchdog, whichever sees the end first; never on the hot path).
  std::atomic<uint64_t> end_claimed{0};
  // exit_no of the last stall whose stuck finding is out (set by the watchdog after it): the
  // vCPU emits an end only after its begin; otherwise the watchdog's next poll emits it.
  std::atomic<uint64_t> begin_reported{0};
  uint64_t begins = 0;  // vCPU thread only
  // The vCPU's thread id: Recorder::SetThreadId, else taken on the vCPU's first exit (once,
  // out of line). 0 until then. Read by the watchdog to look at and signal a stuck thread.
  std::atomic<int32_t> tid{0};
};
}  // namespace internal

class EXITSCOPE_EXPORT Recorder {
 public:
  // Validates options, allocates every ring, calibrates the clock, starts the watchdog if
  // asked. kInvalidArgument names the bad option.
  static Result<std::unique_ptr<Recorder>> Create(const RecorderOptions& options);
  ~Recorder();  // stops the watchdog and the dump-signal thread
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  AddressSpace& address_space() noexcept { return space_; }
  const AddressSpace& address_space() const noexcept { return space_; }
  const Clock& clock() const noexcept { return clock_; }
  uint32_t num_vcpus() const noexcept { return num_vcpus_; }

  // ---- Hot path ------------------------------------------------------------------------
  // Starts timing an exit of `vcpu`. For kMmio / kPio the address is resolved to device and
  // register now. `value` is the guest's data for writes (kept only when dir == kWrite).
  // A BeginExit while the previous exit has not ended records the previous one with
  // kExitFlagNoEnd (counted as begin_without_end).
  [[gnu::always_inline]] void BeginExit(uint32_t vcpu, ExitKind kind, uint64_t addr = 0,
                                        uint8_t size = 0, AccessDir dir = AccessDir::kNone,
                                        uint64_t value = 0) noexcept {
    if (__builtin_expect(vcpu >= num_vcpus_, 0)) return CountBadVcpu();
    internal::VcpuSlot& v = slots_[vcpu];
    const uint64_t now = clock_.Now();
    // MMIO / PIO exits are resolved to device and register later, off the hot path (snapshot,
    // slow path, watchdog), against the address-space generation current now: one load here
    // instead of a search, and names stay right even if a range moves afterwards.
    const bool has_target = kind == ExitKind::kMmio || kind == ExitKind::kPio;
    const uint32_t device = has_target ? space_.generation() : kUnassigned;
    const uint64_t flags =
        (dir == AccessDir::kWrite ? kExitFlagValue : 0) | (has_target ? kExitFlagUnresolved : 0);
    if (__builtin_expect(v.cur[0].load(std::memory_order_relaxed) != 0, 0)) {
      BeginWithoutEnd(vcpu, now);
    }
    // The words of an ExitRecord (layout asserted in exit_record.h), written straight into the
    // in-progress slot under its seqlock.
    const uint64_t s = v.seq.load(std::memory_order_relaxed);
    v.seq.store(s + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    v.cur[0].store(now, std::memory_order_relaxed);
    v.cur[1].store(0, std::memory_order_relaxed);
    v.cur[2].store(addr, std::memory_order_relaxed);
    v.cur[3].store(dir == AccessDir::kWrite ? value : 0, std::memory_order_relaxed);
    v.cur[4].store(vcpu | (static_cast<uint64_t>(device) << 32), std::memory_order_relaxed);
    v.cur[5].store(kNoRegister, std::memory_order_relaxed);
    v.cur[6].store((static_cast<uint64_t>(kind) << 32) | (static_cast<uint64_t>(size) << 40) |
                       (static_cast<uint64_t>(dir) << 48) | (flags << 56),
                   std::memory_order_relaxed);
    v.exit_no.store(++v.begins, std::memory_order_relaxed);
    v.seq.store(s + 2, std::memory_order_release);
    if (__builtin_expect(v.begins == 1, 0)) TakeThreadId(vcpu);
  }

  // Ends the current exit of `vcpu` and appends its record to the vCPU's ring. The first form
  // keeps the value given to BeginExit; the second records `value` (the data returned to the
  // guest for a read). Without a matching BeginExit: counted (end_without_begin), no record.
  [[gnu::always_inline]] void EndExit(uint32_t vcpu) noexcept { EndExitImpl(vcpu, 0, false); }
  [[gnu::always_inline]] void EndExit(uint32_t vcpu, uint64_t value) noexcept {
    EndExitImpl(vcpu, value, true);
  }

  // RAII: BeginExit in the constructor, EndExit in the destructor. A null recorder does
  // nothing (so the embedder can switch recording off).
  class ExitScope {
   public:
    ExitScope(Recorder* r, uint32_t vcpu, ExitKind kind, uint64_t addr = 0, uint8_t size = 0,
              AccessDir dir = AccessDir::kNone, uint64_t value = 0) noexcept
        : r_(r), vcpu_(vcpu) {
      if (r_ != nullptr) r_->BeginExit(vcpu, kind, addr, size, dir, value);
    }
    ~ExitScope() {
      if (r_ == nullptr) return;
      if (has_value_) {
        r_->EndExit(vcpu_, value_);
      } else {
        r_->EndExit(vcpu_);
      }
    }
    // The value to record at the end (e.g. the data a read returns).
    void set_value(uint64_t v) noexcept {
      value_ = v;
      has_value_ = true;
    }
    ExitScope(const ExitScope&) = delete;
    ExitScope& operator=(const ExitScope&) = delete;

   private:
    Recorder* r_;
    uint32_t vcpu_;
    uint64_t value_ = 0;
    bool has_value_ = false;
  };

  // ---- Device events (any thread, lock-free) --------------------------------------------
  void IoSubmit(uint32_t device, uint64_t io_id) noexcept;
  void IoComplete(uint32_t device, uint64_t io_id, int64_t status = 0) noexcept;
  void QueueFull(uint32_t device, uint64_t queue) noexcept;
  void BackendError(uint32_t device, int64_t error, std::string_view note = {}) noexcept;
  void Note(uint32_t device, std::string_view text) noexcept;  // device may be kUnassigned

  // ---- Policy, watchdog, logging (thread-safe, not for the hot path) -------------------
  void SetSlowExitPolicy(SlowExitPolicy policy);
  uint64_t slow_exit_threshold_ns() const noexcept;
  void SetLogSink(LogSink sink);  // nullptr restores the default (stderr)
  void SetFindingHook(FindingHook hook);
  // (Re)starts the watchdog thread with `options`. kInvalidArgument for zero thresholds.
  Status StartWatchdog(const WatchdogOptions& options);
  void StopWatchdog();
  bool watchdog_running() const noexcept;
  // Polls the watchdog has completed since the recorder was created (each one has looked at
  // every vCPU and the in-flight I/Os): how a test knows that polls happened.
  uint64_t watchdog_polls() const noexcept;

  // ---- Stacks of stuck vCPU threads (docs/stacks.md) -------------------------------------
  // The thread that runs `vcpu` (a Linux thread id, gettid()). Without this call the recorder
  // takes the id of the thread that makes the vCPU's first exit. kInvalidArgument for a bad
  // vCPU index or tid <= 0.
  Status SetThreadId(uint32_t vcpu, int32_t tid);
  int32_t thread_id(uint32_t vcpu) const noexcept;  // 0 when unknown or a bad index
  // Installs the handler of real-time signal `signo` (SIGRTMIN..SIGRTMAX) that the watchdog
  // sends a stuck vCPU thread: the thread unwinds its own stack (libunwind) into a buffer
  // allocated at creation, only if it is still inside the same exit; no allocation, no lock.
  // Without it, captures hold the thread's state and kernel stack only. One recorder per
  // process owns the signal (kAlreadyExists otherwise); the previous disposition is restored by
  // RemoveStackSignal or the destructor. Interrupted system calls: SA_RESTART is set, but
  // nanosleep and KVM_RUN return EINTR (the vCPU loop must retry them).
  Status InstallStackSignal(int signo);
  void RemoveStackSignal();
  // Switches captures on or off at run time (StackOptions::enabled at creation).
  void SetStackCapture(bool on) noexcept;
  StackCounters stack_counters() const noexcept;

  // ---- Embedder metadata (thread-safe, mutex) -------------------------------------------
  // String attributes carried in snapshots and dumps ("vmm" = "exitscope-run", "guest" = "blk").
  void SetAttribute(std::string key, std::string value);
  // Named per-vCPU counters ("kvm.exits", "kvm.halt_exits", ...). kInvalidArgument for a bad
  // vCPU index.
  Status SetVcpuCounter(uint32_t vcpu, std::string name, uint64_t value);

  // ---- Reading --------------------------------------------------------------------------
  // A consistent copy of everything (see dump.h), taken without stopping vCPUs.
  Dump Snapshot(const DumpOptions& options = {}) const;
  // The same into `*out`, keeping the storage of its exit vectors: a caller that dumps
  // repeatedly (and can afford to keep the memory) writes into pages it already has instead of
  // fresh ones, which on a nested-virtualisation host cost more than the copy
  // (docs/recorder.md, "Scale").
  void Snapshot(const DumpOptions& options, Dump* out) const;
  // Snapshot() written to `path` (atomically: temp file + rename), streamed: each ring is
  // copied a chunk at a time into file records and written out, without a Dump or a copy of
  // the file in memory (docs/recorder.md, "Scale"). The same bytes as
  // WriteDumpFile(Snapshot(options), path, options) would give at that instant.
  Status WriteDump(const std::string& path, const DumpOptions& options = {}) const;
  // On signal `signo` (e.g. SIGUSR1), a background thread writes a dump into `directory`
  // as exitscope-<comm>-<pid>-<YYYYmmddTHHMMSS>-<n>.esdump and logs its path. The handler only
  // writes to an eventfd; vCPUs never stop. One recorder per process may own the signal
  // (kAlreadyExists if another live recorder does); calling it again on the same recorder
  // replaces its registration. The previous handler is restored by RemoveDumpSignal or the
  // destructor. kInvalidArgument for a bad signal or a missing directory.
  Status InstallDumpSignal(int signo, std::string directory, DumpOptions options = {});
  void RemoveDumpSignal();
  // Path of the last dump written by the signal thread ("" when none yet).
  std::string last_signal_dump() const;

  RingCounters ring_counters(uint32_t vcpu) const noexcept;  // zeros for a bad index
  RecorderCounters counters() const noexcept;
  DeviceEventCounters device_event_counters() const noexcept;
  std::vector<FindingRecord> Findings() const;
  const FlightRecorder& flight_recorder() const noexcept { return rings_; }

  // Fills device / register of a record still marked kExitFlagUnresolved (records read
  // straight from flight_recorder() rings are; Snapshot() and dumps are always resolved).
  void Resolve(ExitRecord* r) const noexcept;

  // Internal: used by the watchdog and slow paths.
  void AddFinding(FindingRecord f);
  void Log(std::string_view line) const;

 private:
  explicit Recorder(const RecorderOptions& options);
  void CountBadVcpu() noexcept;
  // Appends one device event; returns its timestamp (ticks).
  uint64_t WriteDeviceEvent(DeviceEventType type, uint32_t device, uint64_t io_id, int64_t status,
                            std::string_view note) noexcept;
  void BeginWithoutEnd(uint32_t vcpu, uint64_t now) noexcept;
  void TakeThreadId(uint32_t vcpu) noexcept;
  void EndWithoutBegin() noexcept;
  // `stalled_exit_no`: the exit's number when the watchdog had reported it stuck, else 0.
  void SlowPath(const ExitRecord& r, uint64_t stalled_exit_no) noexcept;
  // Keeps `f` in the findings ring, calls the finding hook, and logs its line if `log`.
  void AddFinding(FindingRecord f, bool log);
  // Parts of Snapshot (recorder.cc), shared with the streamed WriteDump (dump_stream.cc):
  // times, process, host, watchdog and address space (maps indexed in *map_index); the
  // in-progress exit of `vcpu` (duration up to `now_ticks`); device events, findings,
  // attributes and named counters.
  void SnapshotMetadata(const DumpOptions& options, Dump* d,
                        std::map<const RegisterMap*, uint32_t>* map_index) const;
  bool ReadInProgress(uint32_t vcpu, uint64_t now_ticks, ExitRecord* out) const;
  void SnapshotEvents(Dump* d) const;

  [[gnu::always_inline]] void EndExitImpl(uint32_t vcpu, uint64_t value, bool has_value) noexcept {
    if (__builtin_expect(vcpu >= num_vcpus_, 0)) return CountBadVcpu();
    internal::VcpuSlot& v = slots_[vcpu];
    const uint64_t now = clock_.Now();
    // The ExitRecord's words (exit_record.h layout), one statement each: a loop of atomic
    // loads is not unrolled at -O2, and costs more than the loads.
    // Word 1 (duration) is not loaded: it is set below.
    static_assert(internal::VcpuSlot::kWords == 7);
    uint64_t w[internal::VcpuSlot::kWords] = {
        v.cur[0].load(std::memory_order_relaxed), 0,
        v.cur[2].load(std::memory_order_relaxed), v.cur[3].load(std::memory_order_relaxed),
        v.cur[4].load(std::memory_order_relaxed), v.cur[5].load(std::memory_order_relaxed),
        v.cur[6].load(std::memory_order_relaxed)};
    if (__builtin_expect(w[0] == 0, 0)) return EndWithoutBegin();
    w[1] = now - w[0];  // duration_ticks
    uint64_t flags = 0;
    if (has_value) {
      w[3] = value;
      flags |= kExitFlagValue;
    }
    const bool stalled = v.stalled.load(std::memory_order_relaxed) == v.begins;
    if (stalled) flags |= kExitFlagStalled;
    if (__builtin_expect(w[1] >= slow_ticks_.load(std::memory_order_relaxed), 0)) {
      flags |= kExitFlagSlow;
    }
    w[6] |= flags << 56;
    // Clear the in-progress slot first (the watchdog then sees no exit), then append.
    const uint64_t s = v.seq.load(std::memory_order_relaxed);
    v.seq.store(s + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    v.cur[0].store(0, std::memory_order_relaxed);
    v.seq.store(s + 2, std::memory_order_release);
    rings_.ring(vcpu).WriteWords(w);
    if (__builtin_expect((flags & (kExitFlagSlow | kExitFlagStalled)) != 0, 0)) {
      ExitRecord r;
      __builtin_memcpy(&r, w, sizeof r);
      SlowPath(r, stalled ? v.begins : 0);
    }
  }

  friend class Watchdog;
  friend class DumpSignalThread;
  friend class StackSampler;

  const uint32_t num_vcpus_;
  Clock clock_;
  std::unique_ptr<internal::VcpuSlot[]> slots_;
  FlightRecorder rings_;
  AddressSpace space_;
  std::atomic<uint64_t> slow_ticks_{~0ull};
  struct Impl;  // out-of-line state: device events, findings, watchdog, metadata, counters
  std::unique_ptr<Impl> impl_;
};

}  // namespace exitscope
