#include "sources/kvm_decode.h"

#include <array>

namespace exitscope::sources {
namespace {

struct NamedCode {
  uint32_t code;
  std::string_view name;
};

// VMX and SVM reasons as the kernel names them: generated from the print fmt of
// testdata/kvm/tracefs-pvm-6.18/events/kvm/kvm_exit/format (Linux 6.18).
constexpr NamedCode kVmxReasons[] = {
    {0, "EXCEPTION_NMI"},
    {1, "EXTERNAL_INTERRUPT"},
    {2, "TRIPLE_FAULT"},
    {3, "INIT_SIGNAL"},
    {4, "SIPI_SIGNAL"},
    {7, "INTERRUPT_WINDOW"},
    {8, "NMI_WINDOW"},
    {9, "TASK_SWITCH"},
    {10, "CPUID"},
    {12, "HLT"},
    {13, "INVD"},
    {14, "INVLPG"},
    {15, "RDPMC"},
    {16, "RDTSC"},
    {18, "VMCALL"},
    {19, "VMCLEAR"},
    {20, "VMLAUNCH"},
    {21, "VMPTRLD"},
    {22, "VMPTRST"},
    {23, "VMREAD"},
    {24, "VMRESUME"},
    {25, "VMWRITE"},
    {26, "VMOFF"},
    {27, "VMON"},
    {28, "CR_ACCESS"},
    {29, "DR_ACCESS"},
    {30, "IO_INSTRUCTION"},
    {31, "MSR_READ"},
    {32, "MSR_WRITE"},
    {33, "INVALID_STATE"},
    {34, "MSR_LOAD_FAIL"},
    {36, "MWAIT_INSTRUCTION"},
    {37, "MONITOR_TRAP_FLAG"},
    {39, "MONITOR_INSTRUCTION"},
    {40, "PAUSE_INSTRUCTION"},
    {41, "MCE_DURING_VMENTRY"},
    {43, "TPR_BELOW_THRESHOLD"},
    {44, "APIC_ACCESS"},
    {45, "EOI_INDUCED"},
    {46, "GDTR_IDTR"},
    {47, "LDTR_TR"},
    {48, "EPT_VIOLATION"},
    {49, "EPT_MISCONFIG"},
    {50, "INVEPT"},
    {51, "RDTSCP"},
    {52, "PREEMPTION_TIMER"},
    {53, "INVVPID"},
    {54, "WBINVD"},
    {55, "XSETBV"},
    {56, "APIC_WRITE"},
    {57, "RDRAND"},
    {58, "INVPCID"},
    {59, "VMFUNC"},
    {60, "ENCLS"},
    {61, "RDSEED"},
    {62, "PML_FULL"},
    {63, "XSAVES"},
    {64, "XRSTORS"},
    {67, "UMWAIT"},
    {68, "TPAUSE"},
    {74, "BUS_LOCK"},
    {75, "NOTIFY"},
    {77, "TDCALL"},
    {84, "MSR_READ_IMM"},
    {85, "MSR_WRITE_IMM"},
};
constexpr NamedCode kSvmReasons[] = {
    {0x000, "read_cr0"},
    {0x002, "read_cr2"},
    {0x003, "read_cr3"},
    {0x004, "read_cr4"},
    {0x008, "read_cr8"},
    {0x010, "write_cr0"},
    {0x012, "write_cr2"},
    {0x013, "write_cr3"},
    {0x014, "write_cr4"},
    {0x018, "write_cr8"},
    {0x020, "read_dr0"},
    {0x021, "read_dr1"},
    {0x022, "read_dr2"},
    {0x023, "read_dr3"},
    {0x024, "read_dr4"},
    {0x025, "read_dr5"},
    {0x026, "read_dr6"},
    {0x027, "read_dr7"},
    {0x030, "write_dr0"},
    {0x031, "write_dr1"},
    {0x032, "write_dr2"},
    {0x033, "write_dr3"},
    {0x034, "write_dr4"},
    {0x035, "write_dr5"},
    {0x036, "write_dr6"},
    {0x037, "write_dr7"},
    {0x040 + 0, "DE excp"},
    {0x040 + 1, "DB excp"},
    {0x040 + 3, "BP excp"},
    {0x040 + 4, "OF excp"},
    {0x040 + 5, "BR excp"},
    {0x040 + 6, "UD excp"},
    {0x040 + 7, "NM excp"},
    {0x040 + 8, "DF excp"},
    {0x040 + 10, "TS excp"},
    {0x040 + 11, "NP excp"},
    {0x040 + 12, "SS excp"},
    {0x040 + 13, "GP excp"},
    {0x040 + 14, "PF excp"},
    {0x040 + 16, "MF excp"},
    {0x040 + 17, "AC excp"},
    {0x040 + 18, "MC excp"},
    {0x040 + 19, "XF excp"},
    {0x060, "interrupt"},
    {0x061, "nmi"},
    {0x062, "smi"},
    {0x063, "init"},
    {0x064, "vintr"},
    {0x065, "cr0_sel_write"},
    {0x066, "read_idtr"},
    {0x067, "read_gdtr"},
    {0x068, "read_ldtr"},
    {0x069, "read_rt"},
    {0x06a, "write_idtr"},
    {0x06b, "write_gdtr"},
    {0x06c, "write_ldtr"},
    {0x06d, "write_rt"},
    {0x06e, "rdtsc"},
    {0x06f, "rdpmc"},
    {0x070, "pushf"},
    {0x071, "popf"},
    {0x072, "cpuid"},
    {0x073, "rsm"},
    {0x074, "iret"},
    {0x075, "swint"},
    {0x076, "invd"},
    {0x077, "pause"},
    {0x078, "hlt"},
    {0x079, "invlpg"},
    {0x07a, "invlpga"},
    {0x07b, "io"},
    {0x07c, "msr"},
    {0x07d, "task_switch"},
    {0x07e, "ferr_freeze"},
    {0x07f, "shutdown"},
    {0x080, "vmrun"},
    {0x081, "hypercall"},
    {0x082, "vmload"},
    {0x083, "vmsave"},
    {0x084, "stgi"},
    {0x085, "clgi"},
    {0x086, "skinit"},
    {0x087, "rdtscp"},
    {0x088, "icebp"},
    {0x089, "wbinvd"},
    {0x08a, "monitor"},
    {0x08b, "mwait"},
    {0x08d, "xsetbv"},
    {0x08f, "write_efer_trap"},
    {0x090, "write_cr0_trap"},
    {0x094, "write_cr4_trap"},
    {0x098, "write_cr8_trap"},
    {0x0a2, "invpcid"},
    {0x0a5, "buslock"},
    {0x0a6, "idle-halt"},
    {0x400, "npf"},
    {0x401, "avic_incomplete_ipi"},
    {0x402, "avic_unaccelerated_access"},
    {0x403, "vmgexit"},
    {0x80000001, "vmgexit_mmio_read"},
    {0x80000002, "vmgexit_mmio_write"},
    {0x80000003, "vmgexit_nmi_complete"},
    {0x80000004, "vmgexit_ap_hlt_loop"},
    {0x80000005, "vmgexit_ap_jump_table"},
    {0x80000010, "vmgexit_page_state_change"},
    {0x80000011, "vmgexit_guest_request"},
    {0x80000012, "vmgexit_ext_guest_request"},
    {0x80000013, "vmgexit_ap_creation"},
    {0x8000fffd, "vmgexit_hypervisor_feature"},
    {0xffffffffu, "invalid_guest_state"},
};

template <size_t N>
constexpr std::string_view Find(const NamedCode (&table)[N], uint32_t code) noexcept {
  for (const NamedCode& nc : table) {
    if (nc.code == code) return nc.name;
  }
  return {};
}

// PVM exception-vector reasons (vectors 0..20; 9 and 15 are reserved).
constexpr std::array<std::string_view, 21> kPvmExceptions = {
    "DE excp", "DB excp", "NMI excp", "BP excp", "OF excp", "BR excp", "UD excp",
    "NM excp", "DF excp", "",         "TS excp", "NP excp", "SS excp", "GP excp",
    "PF excp", "",        "MF excp",  "AC excp", "MC excp", "XM excp", "VE excp",
};

// HC_ reasons: HYPERCALL + 1 .. HYPERCALL + 10, in this order.
constexpr std::array<std::string_view, 11> kPvmHcReasons = {
    "HYPERCALL",     "HC_IRQ_WIN",   "HC_IRQ_HALT",
    "HC_LOAD_PGTBL", "HC_TLB_FLUSH", "HC_TLB_FLUSH_CURRENT",
    "HC_TLB_INVLPG", "HC_LOAD_GS",   "HC_RDMSR",
    "HC_WRMSR",      "HC_LOAD_TLS",
};
// Raw hypercall numbers: PVM_HC_SPECIAL_BASE + n, in a DIFFERENT order from the reasons.
constexpr std::array<std::string_view, 10> kPvmHcByNumber = {
    "HC_LOAD_PGTBL",         // +0
    "HC_IRQ_WIN",            // +1
    "HC_IRQ_HALT",           // +2
    "HC_TLB_FLUSH",          // +3
    "HC_TLB_FLUSH_CURRENT",  // +4
    "HC_TLB_INVLPG",         // +5
    "HC_LOAD_GS",            // +6
    "HC_RDMSR",              // +7
    "HC_WRMSR",              // +8
    "HC_LOAD_TLS",           // +9
};

constexpr NamedCode kUserspaceExits[] = {
    {0, "UNKNOWN"},
    {1, "EXCEPTION"},
    {2, "IO"},
    {3, "HYPERCALL"},
    {4, "DEBUG"},
    {5, "HLT"},
    {6, "MMIO"},
    {7, "IRQ_WINDOW_OPEN"},
    {8, "SHUTDOWN"},
    {9, "FAIL_ENTRY"},
    {10, "INTR"},
    {11, "SET_TPR"},
    {12, "TPR_ACCESS"},
    {13, "S390_SIEIC"},
    {14, "S390_RESET"},
    {15, "DCR"},
    {16, "NMI"},
    {17, "INTERNAL_ERROR"},
    {18, "OSI"},
    {19, "PAPR_HCALL"},
    {20, "S390_UCONTROL"},
    {21, "WATCHDOG"},
    {22, "S390_TSCH"},
    {23, "EPR"},
    {24, "SYSTEM_EVENT"},
    {25, "S390_STSI"},
    {26, "IOAPIC_EOI"},
    {27, "HYPERV"},
    {28, "ARM_NISV"},
    {29, "X86_RDMSR"},
    {30, "X86_WRMSR"},
    {31, "DIRTY_RING_FULL"},
    {32, "AP_RESET_HOLD"},
    {33, "X86_BUS_LOCK"},
    {34, "XEN"},
    {35, "RISCV_SBI"},
    {36, "RISCV_CSR"},
    {37, "NOTIFY"},
    {38, "LOONGARCH_IOCSR"},
    {39, "MEMORY_FAULT"},
    {40, "TDX"},
};

constexpr NamedCode kMsrs[] = {
    {0x00000010, "IA32_TSC"},
    {0x00000011, "KVM_WALL_CLOCK"},
    {0x00000012, "KVM_SYSTEM_TIME"},
    {0x0000001b, "IA32_APIC_BASE"},
    {0x0000003a, "IA32_FEATURE_CONTROL"},
    {0x0000003b, "IA32_TSC_ADJUST"},
    {0x00000048, "IA32_SPEC_CTRL"},
    {0x00000049, "IA32_PRED_CMD"},
    {0x0000008b, "IA32_UCODE_REV"},
    {0x000000e7, "IA32_MPERF"},
    {0x000000e8, "IA32_APERF"},
    {0x000000fe, "IA32_MTRRCAP"},
    {0x0000010a, "IA32_ARCH_CAPABILITIES"},
    {0x0000010b, "IA32_FLUSH_CMD"},
    {0x00000140, "MISC_FEATURES_ENABLES"},
    {0x00000174, "IA32_SYSENTER_CS"},
    {0x00000175, "IA32_SYSENTER_ESP"},
    {0x00000176, "IA32_SYSENTER_EIP"},
    {0x00000179, "IA32_MCG_CAP"},
    {0x0000017a, "IA32_MCG_STATUS"},
    {0x000001a0, "IA32_MISC_ENABLE"},
    {0x000001d9, "IA32_DEBUGCTL"},
    {0x00000277, "IA32_PAT"},
    {0x000002ff, "IA32_MTRR_DEF_TYPE"},
    {0x000006e0, "IA32_TSC_DEADLINE"},
    {0x00000da0, "IA32_XSS"},
    {0x40000000, "HV_X64_GUEST_OS_ID"},
    {0x40000001, "HV_X64_HYPERCALL"},
    {0x4b564d00, "KVM_WALL_CLOCK_NEW"},
    {0x4b564d01, "KVM_SYSTEM_TIME_NEW"},
    {0x4b564d02, "KVM_ASYNC_PF_EN"},
    {0x4b564d03, "KVM_STEAL_TIME"},
    {0x4b564d04, "KVM_PV_EOI_EN"},
    {0x4b564d05, "KVM_POLL_CONTROL"},
    {0x4b564d06, "KVM_ASYNC_PF_INT"},
    {0x4b564d07, "KVM_ASYNC_PF_ACK"},
    {0x4b564d08, "KVM_MIGRATION_CONTROL"},
    {0xc0000080, "IA32_EFER"},
    {0xc0000081, "STAR"},
    {0xc0000082, "LSTAR"},
    {0xc0000083, "CSTAR"},
    {0xc0000084, "SYSCALL_MASK"},
    {0xc0000100, "FS_BASE"},
    {0xc0000101, "GS_BASE"},
    {0xc0000102, "KERNEL_GS_BASE"},
    {0xc0000103, "TSC_AUX"},
    {0xc0010015, "AMD64_HWCR"},
    {0xc0010117, "AMD64_VM_HSAVE_PA"},
    {0xc0011029, "AMD64_DE_CFG"},
};

// x2APIC registers (MSR 0x800 + APIC register offset / 16).
constexpr NamedCode kX2Apic[] = {
    {0x802, "x2APIC ID"},        {0x803, "x2APIC VERSION"},   {0x808, "x2APIC TPR"},
    {0x80a, "x2APIC PPR"},       {0x80b, "x2APIC EOI"},       {0x80d, "x2APIC LDR"},
    {0x80f, "x2APIC SVR"},       {0x828, "x2APIC ESR"},       {0x82f, "x2APIC LVT_CMCI"},
    {0x830, "x2APIC ICR"},       {0x832, "x2APIC LVT_TIMER"}, {0x833, "x2APIC LVT_THERMAL"},
    {0x834, "x2APIC LVT_PMI"},   {0x835, "x2APIC LVT_LINT0"}, {0x836, "x2APIC LVT_LINT1"},
    {0x837, "x2APIC LVT_ERROR"}, {0x838, "x2APIC TMICT"},     {0x839, "x2APIC TMCCT"},
    {0x83e, "x2APIC TDCR"},      {0x83f, "x2APIC SELF_IPI"},
};

constexpr std::array<std::string_view, 32> kExceptionNames = {
    "#DE", "#DB", "#NMI", "#BP", "#OF", "#BR", "#UD", "#NM", "#DF", "",    "#TS",
    "#NP", "#SS", "#GP",  "#PF", "",    "#MF", "#AC", "#MC", "#XM", "#VE", "#CP",
    "",    "",    "",     "",    "",    "",    "#HV", "#VC", "#SX", "",
};

}  // namespace

std::string_view VmxReasonName(uint32_t basic) noexcept {
  return Find(kVmxReasons, basic);
}
std::string_view SvmReasonName(uint32_t code) noexcept {
  return Find(kSvmReasons, code);
}

std::string_view PvmReasonName(uint32_t code, PvmNumbering numbering) noexcept {
  if (code < kPvmExceptions.size()) return kPvmExceptions[code];
  if (code == kPvmFailedVmentry) return "FAILED_VMENTRY";
  const uint32_t major = code >> kPvmExitReasonsShift;
  const uint32_t minor = code & ((1u << kPvmExitReasonsShift) - 1);
  if (major == 2) {  // HYPERCALL and the HC_ split, same in both numberings
    return minor < kPvmHcReasons.size() ? kPvmHcReasons[minor] : std::string_view{};
  }
  if (minor != 0) return {};
  switch (numbering) {
    case PvmNumbering::kUpstream:
      switch (major) {
        case 1:
          return "SYSCALL";
        case 3:
          return "ERETU";
        case 4:
          return "ERETS";
        case 5:
          return "INTERRUPT";
        case 6:
          return "INT80";
        default:
          return {};
      }
    case PvmNumbering::kFork:
      switch (major) {
        case 1:
          return "SYSCALL";
        case 3:
          return "ERETU";
        case 4:
          return "INTERRUPT";
        case 5:
          return "INT80";
        default:
          return {};
      }
  }
  return {};
}

std::string_view PvmHypercallName(uint64_t nr) noexcept {
  if (nr < kPvmHcSpecialBase || nr - kPvmHcSpecialBase >= kPvmHcByNumber.size()) return {};
  return kPvmHcByNumber[nr - kPvmHcSpecialBase];
}

ExitReason DecodeExitReason(uint32_t exit_reason, uint32_t isa, uint64_t info2,
                            PvmNumbering pvm) noexcept {
  ExitReason r;
  switch (static_cast<Isa>(isa)) {
    case Isa::kVmx: {
      const uint32_t basic = exit_reason & 0xffff;
      r.failed_vmentry = (exit_reason & kVmxFailedVmentry) != 0;
      r.name = VmxReasonName(basic);
      r.known = !r.name.empty();
      r.hypercall = basic == 18;  // VMCALL
      r.msr = basic == 31 || basic == 32 || basic == 84 || basic == 85;
      r.io = basic == 30;
      r.mmio = basic == 48 || basic == 49;  // EPT_VIOLATION / EPT_MISCONFIG
      break;
    }
    case Isa::kSvm:
      r.name = SvmReasonName(exit_reason);
      r.known = !r.name.empty();
      r.hypercall = exit_reason == 0x081;
      r.msr = exit_reason == 0x07c;
      r.io = exit_reason == 0x07b;
      r.mmio = exit_reason == 0x400;  // npf
      break;
    case Isa::kPvm: {
      r.failed_vmentry = exit_reason == kPvmFailedVmentry;
      r.name = PvmReasonName(exit_reason, pvm);
      r.known = !r.name.empty();
      const bool hc = (exit_reason >> kPvmExitReasonsShift) == 2;
      r.hypercall = hc;
      if (exit_reason == kPvmHypercall) {
        // The maintainers' encoding: reason HYPERCALL, the raw number in info2.
        r.hypercall_nr = static_cast<int64_t>(info2);
        if (std::string_view hc_name = PvmHypercallName(info2); !hc_name.empty()) r.name = hc_name;
      }
      r.msr = r.name == "HC_RDMSR" || r.name == "HC_WRMSR";
      r.mmio = exit_reason == 14;  // PF excp: MMIO goes through #PF on PVM
      break;
    }
    case Isa::kUnknown:
    default:
      break;
  }
  return r;
}

bool LookupExitReasonName(std::string_view name, uint32_t* code, Isa* isa) noexcept {
  for (const NamedCode& nc : kVmxReasons) {
    if (nc.name == name) {
      *code = nc.code;
      *isa = Isa::kVmx;
      return true;
    }
  }
  for (const NamedCode& nc : kSvmReasons) {
    if (nc.name == name) {
      *code = nc.code;
      *isa = Isa::kSvm;
      return true;
    }
  }
  // PVM's HYPERCALL and HC_ reasons, printed by name by a kernel whose table has them: in
  // neither table above, numbered alike in both PVM numberings.
  for (uint32_t i = 0; i < kPvmHcReasons.size(); ++i) {
    if (kPvmHcReasons[i] == name) {
      *code = kPvmHypercall + i;
      *isa = Isa::kPvm;
      return true;
    }
  }
  return false;
}

std::string_view UserspaceExitName(uint32_t reason) noexcept {
  return Find(kUserspaceExits, reason);
}

std::string_view MsrName(uint32_t index) noexcept {
  if (index >= 0x800 && index <= 0x8ff) {
    std::string_view n = Find(kX2Apic, index);
    return n.empty() ? std::string_view("x2APIC") : n;
  }
  return Find(kMsrs, index);
}

std::string_view ExceptionName(uint32_t vector) noexcept {
  return vector < kExceptionNames.size() ? kExceptionNames[vector] : std::string_view{};
}

}  // namespace exitscope::sources
