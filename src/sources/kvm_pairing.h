// sources/kvm_pairing.h: pairs KvmRecords into ExitEvents, per thread.
//
// Two kinds of exit come out of a kvm trace:
//
//  1. Kernel exits, where the host fires kvm_exit / kvm_entry (VMX, SVM, PVM hosts that have
//     them): kvm_exit -> the next kvm_entry on the same thread, as perf kvm stat pairs them.
//     The reason is decoded from kvm_exit's isa field. Child events seen between the two
//     (kvm_pio, kvm_mmio, kvm_msr, kvm_hypercall, kvm_emulate_insn, kvm_userspace_exit)
//     attach to that exit: they give its sub-key (port, gpa, MSR, hypercall nr), size,
//     direction, value and whether it went to userspace.
//
//  2. Userspace exits where kvm_exit / kvm_entry never fire (kvm-pvm on these machines).
//     Per KVM_RUN (a "run window") the capture shows, on one thread:
//
//        kvm_fpu load            <- KVM_RUN entered: the guest runs from here
//        kvm_pio pio_read / kvm_mmio read   <- completion of the PREVIOUS exit (a read)
//        kvm_emulate_insn        -+
//        kvm_pio / kvm_mmio       |  this window's accesses: they come BEFORE the exit record
//        kvm_fpu unload          -+
//        kvm_userspace_exit      <- exit starts (the VMM handles it from here)
//        ...                        (VMM time)
//        kvm_fpu load            <- exit ends: next KVM_RUN (or kvm_entry if it fires)
//
//     Attribution (the kernel's emit order: x86.c emulator_pio_out traces a write before it
//     exits; a read that goes to userspace is traced only by complete_emulator_pio_in, i.e.
//     first thing in the next window, before any instruction is emulated; kvm_mmio traces
//     unsatisfied-read at the exit and read at completion; in-kernel devices, ioeventfd and
//     QEMU's coalesced PIO/MMIO are traced like any access but no exit follows):
//      - A window's first access, before any kvm_emulate_insn, is the previous exit's
//        completion when that exit may be a read of the same kind (IO: any port; MMIO: the
//        same gpa). It gives the exit its port / value.
//      - The exit's own access is the window's LAST access of the exit's kind: a pio_write
//        for KVM_EXIT_IO, a write or unsatisfied-read for KVM_EXIT_MMIO, a kvm_hypercall for
//        KVM_EXIT_HYPERCALL. A KVM_EXIT_IO whose last kvm_emulate_insn decodes as IN/INS, or
//        whose window has no pio_write, is a read: its port comes with the completion.
//        A KVM_EXIT_IO with a pio_write and no decodable instruction is decided by the next
//        window: a pio_read first there completes it as a read (the write was handled in
//        the kernel: QEMU's `out 0x70; in 0x71`), anything else makes the write the exit's.
//      - Every other access of the window (earlier writes, reads that are not completions,
//        kvm_msr: userspace MSR exits trace no kvm_msr) was handled in the kernel. Each is
//        emitted as an ExitEvent with kernel_access set and end kNotTraced (no exit record
//        of its own, so no time), before the exit it preceded.
//
// Ends (ExitEvent::end): an exit still open when the input ends (kvm_userspace_exit never
// followed by a re-entry, kvm_exit never followed by kvm_entry on a thread that has
// entries) is emitted by Finish() with end kOpenAtEnd and duration 0. On a thread that has
// never shown a kvm_entry (a `trace-cmd report | grep kvm_exit` text), every kvm_exit is
// emitted with end kNotTraced when the thread's next exit (or the end) comes: counted, with
// its reason, but no time.
//
// Nothing is dropped silently: records outside any exit, exits without an end, entries
// without an exit and records lost in ring-buffer overruns are counted in KvmPairingStats.
// After a loss on a CPU the pending state of the threads last seen on that CPU is discarded
// (counted as unpaired), since records in between are missing.
//
// Feed records in time order per thread (a global time order, as trace-cmd report and
// tracecmd_read_next_data give, satisfies this). No allocation per record once every thread
// has been seen; strings handed to the sink are static or interned for the pairer's life.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/huge_pages.h"
#include "sources/event.h"
#include "sources/kvm_decode.h"
#include "sources/kvm_trace.h"

namespace exitscope::sources {

// Converts capture clock units to nanoseconds: ns = ts * mul / div. Identity for nanosecond
// clocks; for x86-tsc, mul = 1'000'000 and div = the TSC frequency in kHz.
struct ClockScale {
  uint64_t mul = 1;
  uint64_t div = 1;
  uint64_t ToNs(uint64_t ts) const noexcept {
    if (mul == div) return ts;
    return static_cast<uint64_t>(static_cast<unsigned __int128>(ts) * mul / div);
  }
  static ClockScale FromTscKhz(uint64_t khz) noexcept { return {1'000'000, khz ? khz : 1}; }
};

// Resolves a port or guest-physical MMIO address to a device and register. Implementations
// own the returned strings for their lifetime (see kvm_device_map.h), and are thread-safe:
// the pairers of a capture read in time segments on threads share one (KvmPairer keeps a
// few answers of its own, so that most exits do not ask it).
class KvmDeviceResolver {
 public:
  virtual ~KvmDeviceResolver() = default;
  // Returns false when the address is in no known device. `dir` picks between registers
  // sharing an offset (16550 RBR read / THR write).
  virtual bool Resolve(SubKeyKind kind, uint64_t addr, uint32_t size, AccessDir dir,
                       std::string_view* device, std::string_view* reg) const = 0;
};

struct KvmPairerOptions {
  PvmNumbering pvm = PvmNumbering::kUpstream;
  ClockScale clock{};
  const KvmDeviceResolver* devices = nullptr;  // not owned; may be null
};

// Counts over everything fed. Nothing a pairer sees is dropped without being counted here.
struct KvmPairingStats {
  std::array<uint64_t, kKvmEventTypeCount> records{};  // per KvmEventType (kOther included)
  uint64_t records_total = 0;
  uint64_t exits = 0;                 // ExitEvents emitted (every kind below, accesses included)
  uint64_t kernel_exits = 0;          // paired kvm_exit -> kvm_entry
  uint64_t userspace_exits = 0;       // paired exits that reached userspace
  uint64_t open_at_end = 0;           // exits emitted open at end of trace (also in unpaired_exits)
  uint64_t exits_time_unknown = 0;    // kvm_exit emitted without time: thread has no kvm_entry
  uint64_t kernel_accesses = 0;       // accesses handled in the kernel with no exit record
  uint64_t lost_events = 0;           // records the ring buffer reported lost
  uint64_t lost_markers = 0;          // loss reports (some without a count)
  uint64_t unpaired_exits = 0;        // kvm_exit / kvm_userspace_exit never ended (trace end,
                                      // another exit first, or state discarded after a loss)
  uint64_t entries_without_exit = 0;  // kvm_entry with no open kvm_exit (the first per thread)
  uint64_t children_outside_exit = 0;  // child records that went to no exit (see kvm.md)
  uint64_t completions = 0;            // read completions attached to their exit after re-entry
  uint64_t failed_vmentry = 0;
  // Exits paired with their end (time known).
  uint64_t paired() const noexcept {
    return exits - kernel_accesses - open_at_end - exits_time_unknown;
  }
};

class KvmPairer {
 public:
  // `sink` is not owned and must outlive the pairer.
  KvmPairer(KvmPairerOptions options, EventSink* sink);

  // One record, in time order for its thread.
  void Feed(const KvmRecord& r);
  // The ring buffer of `cpu` lost `count` records (count < 0: unknown number) before the
  // next record fed from that CPU.
  void OnLost(uint32_t cpu, int64_t count);
  // Tells the pairer that thread `tid` belongs to process `tgid` (the VM). Without it a
  // thread's VM id is its own tid unless records carry a tgid.
  void SetThreadGroup(int32_t tid, int32_t tgid);
  // End of input: emits held exits, counts exits left open as unpaired. Feeding after
  // Finish() starts over per thread (live mode calls it only at the end).
  void Finish();

  // Calls `fn(record, ctx)` for every record fed, before pairing (tests and tools that
  // count raw records; null to stop).
  void SetRecordObserver(void (*fn)(const KvmRecord&, void*), void* ctx) noexcept {
    observer_ = fn;
    observer_ctx_ = ctx;
  }

  const KvmPairingStats& stats() const noexcept { return stats_; }
  const KvmPairerOptions& options() const noexcept { return options_; }
  bool has_observer() const noexcept { return observer_ != nullptr; }

  // Speculative pairing (TraceCmdDat reads a long capture in time segments on threads:
  // docs/trace-files.md "Segments"). A pairer for a segment starts from nothing where the
  // segment starts (or before it), with the vCPU numbering of the pairer that reads in order
  // (Fresh), and is armed where the segment starts (Arm). From there it keeps what it does
  // for the one that has the state there to check and take:
  //  - the threads it vouches for: those numbered by the seed when armed (their state then is
  //    checked), and those it first pairs in the shadow (their records go to the other pairer,
  //    their exits nowhere) until two of their exits have ended, whose state at that point is
  //    checked; their exits are kept;
  //  - every other record, in order, for the other pairer to pair where it comes.
  // CanTake replays that on copies of the threads concerned and checks each state; Take
  // replays it for real into this pairer's sink and takes over those threads. The result is
  // that of one pairer reading every record in order.
  struct Numbering {
    std::unordered_map<int32_t, uint32_t> next_vcpu;    // per VM: the next index
    std::unordered_map<int32_t, uint32_t> vcpu_of_tid;  // thread -> index
  };
  Numbering numbering() const { return {next_vcpu_, vcpu_of_tid_}; }
  // A pairer as this one was before its first record (options, thread groups), with
  // `numbering`, feeding nowhere.
  KvmPairer Fresh(const Numbering& numbering) const;
  // The storage an armed pairer keeps what it kept in, handed back by Take to be reused:
  // its memory is faulted in once.
  class SpecBuffer;
  void Arm(SpecBuffer buffer);
  // Whether `later` (armed where this pairer stands now, then fed the records that follow)
  // can be taken; false when a state differs, it saw a loss, or it kept too much.
  bool CanTake(const KvmPairer& later) const;
  SpecBuffer Take(KvmPairer&& later);
  // An armed pairer's storage, when what it kept is not taken: for the next one to reuse.
  SpecBuffer Disarm();

 private:
  struct Child {
    SubKeyKind kind = SubKeyKind::kNone;
    uint64_t key = 0;
    uint8_t size = 0;
    AccessDir dir = AccessDir::kNone;
    uint64_t value = 0;
    uint64_t rip = 0;
    bool operator==(const Child&) const = default;
  };
  // One access record in a run window (userspace mode).
  struct Access {
    uint64_t ts = 0;
    uint64_t key = 0;
    uint64_t value = 0;
    uint64_t rip = 0;  // of the last kvm_emulate_insn before it, 0 when none
    SubKeyKind kind = SubKeyKind::kNone;
    AccessDir dir = AccessDir::kNone;
    uint8_t size = 0;
    bool unsatisfied = false;  // kvm_mmio unsatisfied-read
    bool operator==(const Access&) const = default;
  };
  enum class Phase : uint8_t { kIdle, kKernelExit, kUserExit };
  // What a finished userspace exit waits for in the next window.
  enum class Hold : uint8_t {
    kNone,
    kPioRead,   // a read: its completion gives the port and value
    kPioMaybe,  // a pio_write candidate and no instruction bytes: a read if a completion comes
    kMmioRead,  // an unsatisfied-read: the read at completion gives the value
  };
  struct Thread {
    Phase phase = Phase::kIdle;
    uint32_t last_cpu = 0;
    int32_t tid = 0;
    int32_t tgid = -1;
    int64_t vcpu = -1;
    mutable int64_t vcpu_index = -1;  // index by thread order, cached (see VcpuOf)
    uint64_t exit_ts = 0;
    ExitEvent ev;  // the exit being built
    bool ev_is_kernel = false;
    bool seen_entry = false;  // a kvm_entry came on this thread: kernel exits have ends
    uint32_t children = 0;    // non-access child records collected for the next / current exit
    Child child;              // kernel exits: the most informative child so far
    // Userspace mode: the current run window.
    std::vector<Access> window;
    bool window_fresh = true;  // no kvm_emulate_insn and no access since the last re-entry
    uint64_t last_rip = 0;     // of the window's last kvm_emulate_insn
    AccessDir insn_dir = AccessDir::kNone;  // IN / OUT of the window's last kvm_emulate_insn
    Hold hold_next = Hold::kNone;           // what the exit being built will wait for once ended
    Access candidate;                       // the pio_write of a kPioMaybe exit
    // A finished exit waiting for the next window's first records.
    Hold held = Hold::kNone;
    ExitEvent held_ev;
    // Speculative pairing (Arm): 0 paired here, 1 in the shadow, 2 left to the other pairer.
    uint8_t spec = 0;
    uint8_t spec_ends = 0;              // exits ended in the shadow
    mutable bool spec_tainted = false;  // numbered here, not by the seed: never vouched for
  };
  // The same pairing state: what is to come pairs the same way (fields a phase does not use
  // are not compared).
  bool SameThread(const Thread& a, const Thread& b) const;

  static constexpr size_t kCpuCache = 64;
  struct CpuLast {
    Thread* thread = nullptr;
    int32_t tid = 0;
  };
  Thread& ThreadOf(const KvmRecord& r) {
    CpuLast& last = cpu_last_[r.cpu % kCpuCache];
    if (last.thread == nullptr || last.tid != r.tid) return ThreadOfSlow(r, &last);
    // Runs of one thread per CPU are the norm.
    if (r.tgid >= 0) last.thread->tgid = r.tgid;
    last.thread->last_cpu = r.cpu;
    return *last.thread;
  }
  Thread& ThreadOfSlow(const KvmRecord& r, CpuLast* last);
  void AddChild(Thread& t, const KvmRecord& r);
  void AddAccess(Thread& t, const KvmRecord& r);
  void ApplyChild(const Thread& t, ExitEvent* e) const;
  void StartKernelExit(Thread& t, const KvmRecord& r);
  void StartUserExit(Thread& t, const KvmRecord& r);
  void EndExit(Thread& t, uint64_t end_ts);
  // The held exit and `r`: true when `r` completed it (and was consumed).
  bool ResolveHeld(Thread& t, const KvmRecord& r);
  // Hands `e` (the thread's exit, done with) to the sink, its device resolved in place.
  void Emit(ExitEvent& e, bool kernel);
  void EmitAccess(Thread& t, const Access& a);
  void EmitWindowAsKernel(Thread& t);
  void ClearWindow(Thread& t, bool count_outside);
  void FlushHeld(Thread& t);
  void EndOpen(Thread& t);
  void Resolve(ExitEvent* e) const;
  void FillIds(Thread& t, ExitEvent* e);
  std::string_view Intern(std::string s);
  uint32_t VcpuOf(int32_t tid, const Thread& t);

  KvmPairerOptions options_;
  EventSink* sink_;
  void (*observer_)(const KvmRecord&, void*) = nullptr;
  void* observer_ctx_ = nullptr;
  KvmPairingStats stats_;
  std::unordered_map<int32_t, Thread> threads_;
  // The thread of the last record of each CPU (cpu % kCpuCache): records of one CPU mostly
  // come from one thread, while the merge interleaves CPUs. Nodes of threads_ never move.
  std::array<CpuLast, kCpuCache> cpu_last_{};
  std::unordered_map<int32_t, int32_t> tgid_of_;
  std::unordered_map<std::string, std::string_view> interned_index_;
  std::deque<std::string> interned_;
  std::vector<std::deque<std::string>> taken_over_;  // interned_ of pairers Take took
  // The resolver's last answers by key, direct mapped: it locks, and the pairers of a read in
  // segments share it, while most exits of a capture go to a few addresses.
  struct DeviceMemo {
    uint64_t addr = 0;
    uint32_t size = 0;
    uint8_t kind = 0, dir = 0;
    bool used = false, found = false;
    std::string_view device, reg;
  };
  mutable std::array<DeviceMemo, 16> device_memo_{};
  // What an armed pairer keeps, in order: an exit, or the index of a record left to the
  // other pairer, or of a thread's state where this pairer starts to vouch for it. An exit in
  // 72 bytes (an ExitEvent is 160: the items are written on one core and read on another,
  // and their bytes are most of that cost), its strings by their index in the buffer's table.
  struct KeptItem {
    uint64_t start_ns, duration_ns, subkey, value, guest_rip;  // subkey: the index, else
    uint32_t vcpu, vm, tid;
    uint16_t reason, user_reason, device, reg;
    uint8_t size, dir, isa, subkey_kind, end, bits;
    uint8_t what;  // kExit, kRecord, kSwitch
  };
  static constexpr uint8_t kKeptExit = 0, kKeptRecord = 1, kKeptSwitch = 2;

 public:
  class SpecBuffer {
    friend class KvmPairer;

   public:
    bool has_storage() const noexcept { return items.capacity() != 0; }

   private:
    // Written as soon as a thread reads a segment, on fresh memory: huge pages. The records
    // are few, but all of a thread the pairer numbered itself (a vCPU first met in the
    // segment): thousands, which on 4 KiB pages fault hundreds of times.
    std::vector<KeptItem, base::HugePageAllocator<KeptItem>> items;
    std::vector<KvmRecord, base::HugePageAllocator<KvmRecord>> records;
    std::vector<std::pair<int32_t, Thread>> switches;
    std::vector<std::string_view> strings;
  };

 private:
  struct Spec final : EventSink {
    void OnExit(const ExitEvent& e) override;
    void Keep(uint8_t what, size_t index) {
      KeptItem& k = kept.items.emplace_back();
      k.what = what;
      k.subkey = index;
    }
    SpecBuffer kept;
    struct Memo {
      std::string_view text;
      uint16_t index = kNoIndex;
    };
    static constexpr uint16_t kNoIndex = UINT16_MAX;
    std::array<Memo, 32> memo{};  // kept.strings by address (OnExit)
    KvmPairingStats at_arm;
    bool failed = false;  // a loss, or too many items
    static constexpr size_t kMaxItems = size_t{1} << 18;
  };
  std::unique_ptr<Spec> spec_;
  void SpecFeed(Thread& t, const KvmRecord& r);
  static ExitEvent Unkept(const KeptItem& k, const SpecBuffer& b);
  void FeedThread(Thread& t, const KvmRecord& r);
  // Per VM: the next vCPU index handed to a thread whose records carry no vcpu_id.
  std::unordered_map<int32_t, uint32_t> next_vcpu_;
  std::unordered_map<int32_t, uint32_t> vcpu_of_tid_;
};

}  // namespace exitscope::sources
