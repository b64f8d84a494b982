// vmm/x86_user64.h: the "user64" guest mode: 64-bit code at CPL3, with just enough CPL0
// scaffolding (page tables, GDT, TSS, IDT, CPL0 stubs) for traps to land somewhere.
//
// This is the mode that runs natively on kvm-pvm hosts (CPL0 code is emulated one instruction
// at a time there); on VMX/SVM hosts it runs natively too. The recipe (docs/host-facts.md section
// 1):
//   - 4-level page tables, U/S set on every level; CR0=0x80050033, CR4=0x620, EFER=0x501;
//   - GDT: 0x08 code DPL0, 0x10 data DPL0, 0x20 TSS (16 bytes), 0x30 code DPL3 (selector
//     0x33), 0x38 data DPL3 (selector 0x3b);
//   - TSS with RSP0 and IST1 and an I/O bitmap at 0x68 that clears the bits of the device
//     ports (everything else stays 1 -> #GP in the guest), plus the trailing 0xff byte;
//   - IDT: 256 interrupt gates of type 0xee (present, DPL3) to CPL0 stubs; the int3 stub is
//     `hlt; iretq` (how a CPL3 guest halts), every other stub reports its vector on
//     ES_DEBUG_FAULT and stops.
// Every vCPU gets its own GDT and TSS (its own RSP0 / IST1 stacks), so vCPUs trapping at the
// same time never share a CPL0 stack. Layout: guests/abi.h.
#pragma once

#include <linux/kvm.h>

#include <cstdint>
#include <span>

#include "exitscope/status.h"
#include "vmm/guest_memory.h"

namespace exitscope::vmm::x86 {

inline constexpr uint64_t kCr0 = 0x80050033;  // PG|AM|WP|NE|ET|MP|PE
inline constexpr uint64_t kCr4 = 0x620;       // OSXMMEXCPT|OSFXSR|PAE
inline constexpr uint64_t kEfer = 0x501;      // LMA|LME|SCE
inline constexpr uint64_t kRflags = 0x202;    // IF | reserved bit 1

inline constexpr uint16_t kSelCode0 = 0x08;
inline constexpr uint16_t kSelData0 = 0x10;
inline constexpr uint16_t kSelTss = 0x20;
inline constexpr uint16_t kSelCode3 = 0x33;  // GDT entry 0x30, RPL 3
inline constexpr uint16_t kSelData3 = 0x3b;  // GDT entry 0x38, RPL 3

inline constexpr uint64_t kGdtCode0 = 0x00af9b000000ffffull;
inline constexpr uint64_t kGdtData0 = 0x00cf93000000ffffull;
inline constexpr uint64_t kGdtCode3 = 0x00affb000000ffffull;
inline constexpr uint64_t kGdtData3 = 0x00cff3000000ffffull;
inline constexpr uint8_t kIdtGateType = 0xee;          // present, DPL3, 64-bit interrupt gate
inline constexpr uint8_t kIst1Vectors[] = {2, 8, 18};  // NMI, #DF, #MC run on IST1

inline constexpr uint64_t kPageFlagsTable = 0x7;  // P | RW | US
inline constexpr uint64_t kPageFlags2M = 0x87;    // P | RW | US | PS

struct PortRange {
  uint16_t base;
  uint16_t count;
};

// Guest-physical addresses of one vCPU's structures.
uint64_t GdtAddr(uint32_t vcpu);
uint64_t TssAddr(uint32_t vcpu);
uint64_t Rsp0(uint32_t vcpu);  // top of the CPL0 stack
uint64_t Ist1(uint32_t vcpu);  // top of the IST1 stack
uint64_t UserStackTop(uint32_t vcpu);

// The 16-byte 64-bit TSS descriptor (available, type 0x9) for a TSS at `base`.
void TssDescriptor(uint64_t base, uint32_t limit, uint64_t out[2]);
// The 16-byte IDT gate to `handler` through selector 0x08 on `ist` (0 = none).
void IdtGate(uint64_t handler, uint8_t ist, uint64_t out[2]);
// The CPL0 stub of `vector` (ES_STUB_SIZE bytes).
void Stub(uint8_t vector, uint8_t out[16]);

// Writes page tables, IDT, stubs and every vCPU's GDT and TSS into `mem`. `ports` are the
// I/O ports the guest may use at CPL3 (the devices' PIO ranges).
Status BuildTables(GuestMemory& mem, uint32_t num_vcpus, std::span<const PortRange> ports);

// Sets the user64 segment, control and descriptor-table registers of `vcpu` in `sregs`
// (other fields, e.g. apic_base, are left as KVM reported them).
void SetUser64Sregs(uint32_t vcpu, kvm_sregs* sregs);
// The general registers at entry: rip = entry, rsp = the vCPU's stack, rdi = vcpu,
// rsi = num_vcpus, rdx = arg.
kvm_regs User64Regs(uint64_t entry, uint32_t vcpu, uint32_t num_vcpus, uint64_t arg);

}  // namespace exitscope::vmm::x86
