// sources/kvm_decode.h: names for kvm_exit reasons (VMX, SVM, PVM), KVM_EXIT_* userspace exit
// reasons, PVM hypercalls and common MSRs.
//
// The table is chosen per record from kvm_exit's `isa` field (1 VMX, 2 SVM, 3 PVM), never
// from the analysing host, so a trace taken on an AMD PVM host decodes the same anywhere.
// VMX and SVM names are the kernel's own (the print fmt of kvm_exit in
// testdata/kvm/tracefs-pvm-6.18/events/kvm/kvm_exit/format). PVM follows virt-pvm/linux
// pvm_trace.h; a fork numbers differently (PvmNumbering::kFork). PVM hypercalls get one
// reason per hypercall ("HC_WRMSR") both when the kernel reports HC_ reasons directly
// (HYPERCALL + 1..10) and when it reports HYPERCALL with the raw number in info2
// (PVM_HC_SPECIAL_BASE 0x17088200 + n, numbered in a different order; mapped explicitly).
//
// Every returned string_view points to static storage.
#pragma once

#include <cstdint>
#include <string_view>

#include "sources/event.h"

namespace exitscope::sources {

// VMX exit_reason flag bit (exit_reason & 0x80000000): the VM entry itself failed.
inline constexpr uint32_t kVmxFailedVmentry = 0x80000000u;

// PVM numbering. kUpstream: SYSCALL 0x10000, HYPERCALL 0x20000, ERETU 0x30000,
// ERETS 0x40000, INTERRUPT 0x50000, INT80 0x60000. kFork: ERETS removed, INTERRUPT 0x40000,
// INT80 0x50000.
enum class PvmNumbering : uint8_t { kUpstream = 0, kFork };

inline constexpr uint32_t kPvmExitReasonsShift = 16;
inline constexpr uint32_t kPvmHypercall = 2u << kPvmExitReasonsShift;  // 0x20000, both numberings
inline constexpr uint64_t kPvmHcSpecialBase = 0x17088200;
inline constexpr uint32_t kPvmFailedVmentry = 1025;

// A decoded kvm_exit reason. `name` is the key perf kvm stat would show, refined: PVM
// hypercalls are split into HC_* names. `failed_vmentry` is set for VMX exit_reason with
// bit 31 and for PVM FAILED_VMENTRY. `known` is false when the number is in no table (name
// is then empty: the caller prints the number).
struct ExitReason {
  std::string_view name;
  bool known = false;
  bool failed_vmentry = false;
  bool hypercall = false;  // a hypercall exit (VMCALL/VMMCALL/PVM HYPERCALL/HC_*)
  bool msr = false;        // an MSR access exit (VMX MSR_READ/WRITE, SVM msr, PVM HC_RDMSR/WRMSR)
  bool io = false;         // port I/O exit
  bool mmio = false;       // an exit that may be MMIO (EPT_VIOLATION/MISCONFIG, npf, PF excp)
  int64_t hypercall_nr = -1;  // raw hypercall number when the record carries one (PVM info2)
};

// Decodes one kvm_exit from its exit_reason, isa and info2 fields.
ExitReason DecodeExitReason(uint32_t exit_reason, uint32_t isa, uint64_t info2,
                            PvmNumbering pvm = PvmNumbering::kUpstream) noexcept;

// Reason names for one table; empty when unknown. For VMX pass the basic reason
// (exit_reason & 0xffff).
std::string_view VmxReasonName(uint32_t basic) noexcept;
std::string_view SvmReasonName(uint32_t code) noexcept;
std::string_view PvmReasonName(uint32_t code, PvmNumbering numbering) noexcept;
// HC_* name for a PVM raw hypercall number (0x17088200 + n), empty when not a PVM hypercall.
std::string_view PvmHypercallName(uint64_t nr) noexcept;

// Inverse lookups for text sources, which print names: the VMX / SVM code of a name, or the
// PVM code of HYPERCALL and the HC_ reasons (0x20000 + n, the same in both numberings; in
// neither the VMX nor the SVM table). Returns false when no table has the name.
bool LookupExitReasonName(std::string_view name, uint32_t* code, Isa* isa) noexcept;

// KVM_EXIT_* name without the prefix ("IO", "MMIO", "HLT"); empty when unknown.
std::string_view UserspaceExitName(uint32_t reason) noexcept;

// Name of a common MSR ("IA32_EFER", "kvm-clock SYSTEM_TIME_NEW", "x2APIC ICR"); empty
// when not in the table.
std::string_view MsrName(uint32_t index) noexcept;

// Exception vector mnemonic ("#PF"), empty when reserved.
std::string_view ExceptionName(uint32_t vector) noexcept;

}  // namespace exitscope::sources
