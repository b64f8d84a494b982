#include "sources/kvm_trace.h"

#include <traceevent/event-parse.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

namespace exitscope::sources {
namespace {

constexpr std::array<std::string_view, kKvmEventTypeCount> kNames = {
    "other",
    "kvm_exit",
    "kvm_entry",
    "kvm_userspace_exit",
    "kvm_fpu",
    "kvm_pio",
    "kvm_mmio",
    "kvm_msr",
    "kvm_hypercall",
    "kvm_emulate_insn",
    "vcpu_match_mmio",
    "kvm_page_fault",
    "kvm_inj_exception",
    "kvm_cpuid",
    "sched_switch",
};

// Field names per event type, in the slot order KvmTepDecoder::Decode reads them.
struct EventSpec {
  KvmEventType type;
  std::array<const char*, 9> fields;
};
constexpr EventSpec kSpecs[] = {
    {KvmEventType::kExit,
     {"exit_reason", "guest_rip", "isa", "info1", "info2", "intr_info", "error_code", "vcpu_id",
      nullptr}},
    {KvmEventType::kEntry, {"vcpu_id", "rip"}},
    {KvmEventType::kUserspaceExit, {"reason", "errno"}},
    {KvmEventType::kFpu, {"load"}},
    {KvmEventType::kPio, {"rw", "port", "size", "count", "val"}},
    {KvmEventType::kMmio, {"type", "len", "gpa", "val"}},
    {KvmEventType::kMsr, {"write", "ecx", "data", "exception"}},
    {KvmEventType::kHypercall, {"nr", "a0"}},
    {KvmEventType::kEmulateInsn, {"rip", "csbase", "len", "insn", "failed"}},
    {KvmEventType::kVcpuMatchMmio, {"gva", "gpa", "write"}},
    {KvmEventType::kPageFault, {"vcpu_id", "guest_rip", "fault_address", "error_code"}},
    {KvmEventType::kInjException, {"exception", "has_error", "error_code"}},
    {KvmEventType::kCpuid, {"function"}},
    {KvmEventType::kSchedSwitch, {"prev_pid", "prev_state", "next_pid"}},
};

// The tracepoint system of an event type.
const char* SystemOf(KvmEventType t) noexcept {
  return t == KvmEventType::kSchedSwitch ? "sched" : "kvm";
}

}  // namespace

std::string_view KvmEventName(KvmEventType t) noexcept {
  const auto i = static_cast<size_t>(t);
  return i < kNames.size() ? kNames[i] : kNames[0];
}

KvmEventType KvmEventFromName(std::string_view name) noexcept {
  for (size_t i = 1; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<KvmEventType>(i);
  }
  return KvmEventType::kOther;
}

bool KvmDecoderReads(std::string_view system, std::string_view name) noexcept {
  // A capture holds every format of its host: most are of other systems, told apart here
  // without looking at their names (SystemOf gives the two systems read).
  if (system != SystemOf(KvmEventType::kExit) && system != SystemOf(KvmEventType::kSchedSwitch))
    return false;
  for (const EventSpec& spec : kSpecs) {
    if (KvmEventName(spec.type) == name && system == SystemOf(spec.type)) return true;
  }
  return false;
}

KvmTepDecoder::KvmTepDecoder(tep_handle* tep) : tep_(tep) {
  by_id_.fill(KvmEventType::kOther);
  if (tep_ == nullptr) return;
  swap_ = tep_is_file_bigendian(tep_) != tep_is_local_bigendian(tep_);
  for (const EventSpec& spec : kSpecs) {
    tep_event* ev = tep_find_event_by_name(tep_, SystemOf(spec.type),
                                           std::string(KvmEventName(spec.type)).c_str());
    if (ev == nullptr) continue;
    EventFields& ef = fields_[Index(spec.type)];
    ef.id = ev->id;
    if (ev->id >= 0 && ev->id < kIdMapSize) by_id_[ev->id] = spec.type;
    if (tep_format_field* ct = tep_find_common_field(ev, "common_type")) {
      common_type_ = MakeField(ct->offset, ct->size);
    }
    if (tep_format_field* cp = tep_find_common_field(ev, "common_pid")) {
      common_pid_ = MakeField(cp->offset, cp->size);
    }
    for (int i = 0; i < kMaxFields; ++i) {
      if (spec.fields[i] == nullptr) continue;
      tep_format_field* f = tep_find_field(ev, spec.fields[i]);
      if (f == nullptr) continue;
      ef.f[i] = MakeField(f->offset, f->size);
      ef.min_size = std::max(ef.min_size, f->offset + f->size);
    }
  }
}

KvmEventType KvmTepDecoder::TypeOf(const tep_record* record) const noexcept {
  if (record == nullptr) return KvmEventType::kOther;
  if (record->size < 0) return KvmEventType::kOther;
  return TypeOfBytes<false>(static_cast<const uint8_t*>(record->data),
                            static_cast<uint32_t>(record->size));
}

bool KvmTepDecoder::Decode(const tep_record* record, uint32_t cpu, KvmRecord* out) noexcept {
  if (record == nullptr || record->size < 0) return false;
  return DecodeBytes(static_cast<const uint8_t*>(record->data), static_cast<uint32_t>(record->size),
                     record->ts, cpu, out);
}

bool KvmTepDecoder::DecodeBytes(const uint8_t* d, uint32_t size, uint64_t ts, uint32_t cpu,
                                KvmRecord* out) noexcept {
  return DecodeImpl<false>(d, size, ts, cpu, out);
}

bool KvmTepDecoder::DecodePadded(const uint8_t* d, uint32_t size, uint64_t ts, uint32_t cpu,
                                 KvmRecord* out) noexcept {
  return swap_ ? DecodeImpl<false>(d, size, ts, cpu, out) : DecodeImpl<true>(d, size, ts, cpu, out);
}

template <bool kPadded>
bool KvmTepDecoder::DecodeImpl(const uint8_t* d, uint32_t size, uint64_t ts, uint32_t cpu,
                               KvmRecord* out) noexcept {
  // Shadows the member Read: the body below reads fields the same way in both instantiations.
  const auto Read = [this](const uint8_t* data, Field f) { return Get<kPadded>(data, f); };
  const KvmEventType t = TypeOfBytes<kPadded>(d, size);
  if (t == KvmEventType::kOther) return false;
  const EventFields& ef = fields_[Index(t)];
  if (static_cast<int64_t>(size) < ef.min_size) {
    ++short_records_;
    return false;
  }
  const auto& f = ef.f;
  KvmRecord& r = *out;
  r.ts = ts;
  r.cpu = cpu;
  r.tid = static_cast<int32_t>(Read(d, common_pid_));
  r.tgid = -1;
  r.type = t;
  switch (t) {
    case KvmEventType::kExit:
      r.exit_reason = static_cast<uint32_t>(Read(d, f[0]));
      r.guest_rip = Read(d, f[1]);
      r.isa = static_cast<uint32_t>(Read(d, f[2]));
      r.info1 = Read(d, f[3]);
      r.info2 = Read(d, f[4]);
      r.intr_info = static_cast<uint32_t>(Read(d, f[5]));
      r.error_code = static_cast<uint32_t>(Read(d, f[6]));
      r.vcpu_id = f[7].offset >= 0 ? static_cast<int64_t>(Read(d, f[7])) : -1;
      break;
    case KvmEventType::kEntry:
      r.vcpu_id = f[0].offset >= 0 ? static_cast<int64_t>(Read(d, f[0])) : -1;
      r.guest_rip = Read(d, f[1]);
      break;
    case KvmEventType::kUserspaceExit:
      r.reason = static_cast<uint32_t>(Read(d, f[0]));
      r.err = static_cast<int32_t>(static_cast<uint32_t>(Read(d, f[1])));
      break;
    case KvmEventType::kFpu:
      r.write = static_cast<uint32_t>(Read(d, f[0]));
      break;
    case KvmEventType::kPio:
      r.write = static_cast<uint32_t>(Read(d, f[0]));
      r.addr = Read(d, f[1]);
      r.size = static_cast<uint32_t>(Read(d, f[2]));
      r.count = static_cast<uint32_t>(Read(d, f[3]));
      r.data = Read(d, f[4]);
      break;
    case KvmEventType::kMmio:
      r.mmio_type = static_cast<uint32_t>(Read(d, f[0]));
      r.size = static_cast<uint32_t>(Read(d, f[1]));
      r.addr = Read(d, f[2]);
      r.data = Read(d, f[3]);
      r.write = r.mmio_type == kKvmMmioWrite ? 1 : 0;
      break;
    case KvmEventType::kMsr:
      r.write = static_cast<uint32_t>(Read(d, f[0]));
      r.addr = Read(d, f[1]);
      r.data = Read(d, f[2]);
      r.exception = static_cast<uint8_t>(Read(d, f[3]));
      break;
    case KvmEventType::kHypercall:
      r.addr = Read(d, f[0]);
      r.data = Read(d, f[1]);
      break;
    case KvmEventType::kEmulateInsn: {
      r.guest_rip = Read(d, f[0]);
      r.addr = Read(d, f[1]);
      const uint64_t len = Read(d, f[2]);
      r.insn_len = static_cast<uint8_t>(len > r.insn.size() ? r.insn.size() : len);
      if (f[3].offset >= 0) {
        const size_t n = std::min<size_t>(static_cast<size_t>(f[3].size), r.insn.size());
        std::memcpy(r.insn.data(), d + f[3].offset, n);
        if (r.insn_len > n) r.insn_len = static_cast<uint8_t>(n);
      } else {
        r.insn_len = 0;
      }
      r.failed = static_cast<uint8_t>(Read(d, f[4]));
      break;
    }
    case KvmEventType::kVcpuMatchMmio:
      r.data = Read(d, f[0]);
      r.addr = Read(d, f[1]);
      r.write = static_cast<uint32_t>(Read(d, f[2]));
      break;
    case KvmEventType::kPageFault:
      r.vcpu_id = f[0].offset >= 0 ? static_cast<int64_t>(Read(d, f[0])) : -1;
      r.guest_rip = Read(d, f[1]);
      r.addr = Read(d, f[2]);
      r.error_code = static_cast<uint32_t>(Read(d, f[3]));
      break;
    case KvmEventType::kInjException:
      r.exception = static_cast<uint8_t>(Read(d, f[0]));
      r.has_error = static_cast<uint8_t>(Read(d, f[1]));
      r.error_code = static_cast<uint32_t>(Read(d, f[2]));
      break;
    case KvmEventType::kCpuid:
      r.addr = Read(d, f[0]);
      break;
    case KvmEventType::kSchedSwitch:
      r.prev_tid = static_cast<int32_t>(Read(d, f[0]));
      r.prev_state = Read(d, f[1]);
      r.next_tid = static_cast<int32_t>(Read(d, f[2]));
      break;
    case KvmEventType::kOther:
    case KvmEventType::kCount:
      return false;
  }
  return true;
}

}  // namespace exitscope::sources
