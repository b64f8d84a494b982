// sources/kvm_trace.h: one decoded KVM tracepoint hit, and the adapter from libtraceevent.
//
// Every kernel-side source (trace-cmd .dat through libtracecmd, live tracefs raw pages through
// kbuffer/libtraceevent, ftrace / trace-cmd report text, `perf script` text) turns each kvm
// tracepoint hit into one KvmRecord and hands it to a KvmPairer (kvm_pairing.h), which pairs
// them into ExitEvents. A KvmRecord is a plain value, reused by the caller for every record:
// decoding never allocates.
//
//   tep_handle* tep = tracecmd_get_tep(handle);        // or the live side's tep
//   KvmTepDecoder decoder(tep);                        // looks up kvm:* events once
//   KvmPairer pairer(options, &sink);
//   KvmRecord rec;
//   while (tep_record* r = next()) {
//     if (r->missed_events) pairer.OnLost(cpu, r->missed_events);  // <0: unknown count
//     if (decoder.Decode(r, cpu, &rec)) pairer.Feed(rec);
//   }
//   pairer.Finish();
//
// Timestamps stay in the capture clock's units (ns for local/global/mono/boot, TSC cycles
// for x86-tsc); the pairer converts with a ClockScale.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

struct tep_handle;
struct tep_record;
struct tep_event;

namespace exitscope::sources {

// The kvm tracepoints the analyser understands. kOther: a record of an event it does not use
// (still counted by the pairer).
enum class KvmEventType : uint8_t {
  kOther = 0,
  kExit,           // kvm:kvm_exit
  kEntry,          // kvm:kvm_entry
  kUserspaceExit,  // kvm:kvm_userspace_exit
  kFpu,            // kvm:kvm_fpu (load / unload around each KVM_RUN)
  kPio,            // kvm:kvm_pio
  kMmio,           // kvm:kvm_mmio
  kMsr,            // kvm:kvm_msr
  kHypercall,      // kvm:kvm_hypercall
  kEmulateInsn,    // kvm:kvm_emulate_insn
  kVcpuMatchMmio,  // kvm:vcpu_match_mmio
  kPageFault,      // kvm:kvm_page_fault
  kInjException,   // kvm:kvm_inj_exception
  kCpuid,          // kvm:kvm_cpuid
  kSchedSwitch,    // sched:sched_switch (not a kvm event: when the vCPU thread was off-CPU)
  kCount,
};
inline constexpr size_t kKvmEventTypeCount = static_cast<size_t>(KvmEventType::kCount);

// The tracepoint name ("kvm_exit", "sched_switch"), "other" for kOther.
std::string_view KvmEventName(KvmEventType t) noexcept;
// Inverse of KvmEventName for the kvm tracepoint names; kOther when not one of ours.
KvmEventType KvmEventFromName(std::string_view name) noexcept;

// kvm_mmio's `type` field.
inline constexpr uint32_t kKvmMmioUnsatisfiedRead = 0;
inline constexpr uint32_t kKvmMmioRead = 1;
inline constexpr uint32_t kKvmMmioWrite = 2;

// One tracepoint hit. Which fields are meaningful depends on `type` (listed per field, with
// the tracepoint field each comes from). Fields a record does not carry keep their old
// value: read only what `type` defines.
struct KvmRecord {
  uint64_t ts = 0;    // capture clock units (see ClockScale in kvm_pairing.h)
  int32_t tid = 0;    // common_pid: the thread that hit the tracepoint
  int32_t tgid = -1;  // its process (the VM) when the source knows it, else -1
  uint32_t cpu = 0;
  KvmEventType type = KvmEventType::kOther;

  // kExit: exit_reason, isa, guest_rip, info1, info2, intr_info, error_code, vcpu_id.
  // kEntry: vcpu_id, rip (guest_rip). kPageFault: vcpu_id, guest_rip, addr (fault_address),
  // error_code.
  uint32_t exit_reason = 0;
  uint32_t isa = 0;  // 1 VMX, 2 SVM, 3 PVM
  // Text sources only: the reason as the trace printed it when no table knows it (empty
  // otherwise); views the source's text, valid until the next record.
  std::string_view reason_name{};
  uint64_t guest_rip = 0;
  uint64_t info1 = 0;
  uint64_t info2 = 0;
  uint32_t intr_info = 0;
  uint32_t error_code = 0;
  int64_t vcpu_id = -1;  // -1 when the event has no vcpu_id field

  // kUserspaceExit: reason (KVM_EXIT_*), err (errno field, < 0: "restart"/"error").
  uint32_t reason = 0;
  int32_t err = 0;

  // kFpu: write = load (1 load, 0 unload).
  // kPio: write = rw, addr = port, size, count, data = val.
  // kMmio: mmio_type, size = len, addr = gpa, data = val, write = (type == write).
  // kMsr: write, addr = ecx, data, exception.
  // kHypercall: addr = nr, data = a0.
  // kVcpuMatchMmio: addr = gpa, data = gva, write.
  // kInjException: exception, has_error, error_code.
  // kCpuid: addr = function.
  uint32_t write = 0;
  uint64_t addr = 0;
  uint64_t data = 0;
  uint32_t size = 0;
  uint32_t count = 0;
  uint32_t mmio_type = 0;
  uint8_t exception = 0;
  uint8_t has_error = 0;

  // kSchedSwitch: prev_pid, prev_state, next_pid. `tid` is prev_pid (the common_pid of the
  // switch), the thread that stops running on `cpu`; next_tid starts running there.
  // prev_state 0 (TASK_RUNNING) means prev was preempted and is still runnable.
  int32_t prev_tid = 0;
  int32_t next_tid = 0;
  uint64_t prev_state = 0;

  // kEmulateInsn: guest_rip (rip), csbase (in addr), insn_len, insn bytes, failed.
  uint8_t insn_len = 0;
  uint8_t failed = 0;
  std::array<uint8_t, 15> insn{};
};

// True for the events KvmTepDecoder reads (kvm:kvm_exit, kvm:kvm_entry, ..., sched:sched_switch):
// the only formats a .dat reader needs libtraceevent to parse.
bool KvmDecoderReads(std::string_view system, std::string_view name) noexcept;

// Decodes tep records of the kvm events into KvmRecords. Built once per tep_handle: it looks
// up each kvm event and caches its field offsets and sizes, so Decode() is a type-id compare
// and a few fixed-offset loads (byte-swapped when the capture's endianness differs). Events
// the tep does not define (an older kernel, a host without kvm) are simply never matched.
// Not thread-safe; one per reader.
class KvmTepDecoder {
 public:
  explicit KvmTepDecoder(tep_handle* tep);

  // Fills `out` from `record` (taken on `cpu`). Returns false, leaving `out` untouched, when
  // the record is not one of the kvm events this decoder knows (its type is then
  // KvmEventType::kOther for statistics: see TypeOf()). A record too short for its event's
  // fields is rejected (returns false) and counted in short_records().
  bool Decode(const tep_record* record, uint32_t cpu, KvmRecord* out) noexcept;
  // The same on a record's bytes (`size` of them at `data`, timestamp `ts`): what a reader
  // that walks ring pages itself calls, without building a tep_record.
  bool DecodeBytes(const uint8_t* data, uint32_t size, uint64_t ts, uint32_t cpu,
                   KvmRecord* out) noexcept;
  // The same, faster, for a record followed by at least 7 readable bytes (a .dat reader's
  // pages, which end in padding): each field one unaligned 8-byte load, masked to its size,
  // when the capture has this host's byte order. Same result as DecodeBytes.
  bool DecodePadded(const uint8_t* data, uint32_t size, uint64_t ts, uint32_t cpu,
                    KvmRecord* out) noexcept;

  // The KvmEventType of a record's common_type (kOther when not a kvm event we know).
  KvmEventType TypeOf(const tep_record* record) const noexcept;

  // Which of the kvm events this tep defines (false: not in the capture's formats).
  bool Has(KvmEventType t) const noexcept { return fields_[Index(t)].id >= 0; }
  uint64_t short_records() const noexcept { return short_records_; }

 private:
  struct Field {
    int16_t offset = -1;
    int16_t size = 0;
    // For DecodePadded: where to load 8 bytes and the mask that keeps the field's (0: absent, or
    // a size not read as a number).
    uint16_t at = 0;
    uint64_t mask = 0;
  };
  static constexpr Field MakeField(int offset, int size) noexcept {
    const bool number = offset >= 0 && (size == 1 || size == 2 || size == 4 || size == 8);
    return {static_cast<int16_t>(offset), static_cast<int16_t>(size),
            static_cast<uint16_t>(number ? offset : 0),
            number ? (size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * size)) - 1) : 0};
  }
  // Per event: its id and the fields we read, in a fixed slot order per event type.
  static constexpr int kMaxFields = 9;
  struct EventFields {
    int id = -1;
    int min_size = 0;  // smallest data size that holds every field we read
    std::array<Field, kMaxFields> f{};
  };
  static constexpr size_t Index(KvmEventType t) noexcept { return static_cast<size_t>(t); }
  template <bool kPadded>
  KvmEventType TypeOfBytes(const uint8_t* data, uint32_t size) const noexcept {
    if (static_cast<int64_t>(size) < common_type_.offset + common_type_.size) {
      return KvmEventType::kOther;
    }
    const uint64_t id = Get<kPadded>(data, common_type_);
    return id < static_cast<uint64_t>(kIdMapSize) ? by_id_[id] : KvmEventType::kOther;
  }
  template <bool kPadded>
  bool DecodeImpl(const uint8_t* data, uint32_t size, uint64_t ts, uint32_t cpu,
                  KvmRecord* out) noexcept;
  // Read(), or with kPadded (DecodePadded: 7 readable bytes after the record, no byte swap)
  // one load and a mask.
  template <bool kPadded>
  uint64_t Get(const uint8_t* data, Field f) const noexcept {
    if constexpr (kPadded) {
      uint64_t v;
      std::memcpy(&v, data + f.at, 8);
      return v & f.mask;
    } else {
      return Read(data, f);
    }
  }
  uint64_t Read(const uint8_t* data, Field f) const noexcept {
    switch (f.size) {
      case 1:
        return data[f.offset];
      case 2: {
        uint16_t v;
        std::memcpy(&v, data + f.offset, 2);
        return swap_ ? std::byteswap(v) : v;
      }
      case 4: {
        uint32_t v;
        std::memcpy(&v, data + f.offset, 4);
        return swap_ ? std::byteswap(v) : v;
      }
      case 8: {
        uint64_t v;
        std::memcpy(&v, data + f.offset, 8);
        return swap_ ? std::byteswap(v) : v;
      }
      default:
        return 0;  // absent field (offset -1) or a size we do not read as a number
    }
  }

  tep_handle* tep_;
  bool swap_ = false;
  Field common_type_ = MakeField(0, 2);
  Field common_pid_ = MakeField(4, 4);
  std::array<EventFields, kKvmEventTypeCount> fields_{};
  // common_type id -> KvmEventType, for ids < kIdMapSize (kernel ids are small).
  static constexpr int kIdMapSize = 4096;
  std::array<KvmEventType, kIdMapSize> by_id_{};
  uint64_t short_records_ = 0;
};

}  // namespace exitscope::sources
