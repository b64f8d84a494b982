#include "vmm/x86_user64.h"

#include <cstring>
#include <string>
#include <vector>

#include "guests/abi.h"

namespace exitscope::vmm::x86 {

uint64_t GdtAddr(uint32_t vcpu) {
  return ES_GDT_ADDR + vcpu * ES_GDT_STRIDE;
}
uint64_t TssAddr(uint32_t vcpu) {
  return ES_TSS_ADDR + vcpu * ES_TSS_STRIDE;
}
uint64_t Rsp0(uint32_t vcpu) {
  return ES_KSTACK_ADDR + vcpu * ES_KSTACK_STRIDE + 0x2000;
}
uint64_t Ist1(uint32_t vcpu) {
  return ES_KSTACK_ADDR + vcpu * ES_KSTACK_STRIDE + 0x4000;
}
uint64_t UserStackTop(uint32_t vcpu) {
  return ES_USTACK_ADDR + (vcpu + 1) * ES_USTACK_STRIDE;
}

void TssDescriptor(uint64_t base, uint32_t limit, uint64_t out[2]) {
  out[0] = (limit & 0xffffull) | ((base & 0xffffffull) << 16) | (0x89ull << 40) |
           ((static_cast<uint64_t>(limit) >> 16 & 0xf) << 48) | ((base >> 24 & 0xff) << 56);
  out[1] = base >> 32;
}

void IdtGate(uint64_t handler, uint8_t ist, uint64_t out[2]) {
  out[0] = (handler & 0xffff) | (static_cast<uint64_t>(kSelCode0) << 16) |
           (static_cast<uint64_t>(ist & 7) << 32) | (static_cast<uint64_t>(kIdtGateType) << 40) |
           ((handler >> 16 & 0xffff) << 48);
  out[1] = handler >> 32;
}

void Stub(uint8_t vector, uint8_t out[16]) {
  std::memset(out, 0xcc, 16);
  if (vector == 3) {
    // int3 from CPL3: halt (KVM_EXIT_HLT), then return to the instruction after the int3.
    const uint8_t hlt_iretq[] = {0xf4, 0x48, 0xcf};
    std::memcpy(out, hlt_iretq, sizeof(hlt_iretq));
    return;
  }
  // mov eax, vector; mov dx, ES_DEBUG_FAULT; out dx, eax; 1: hlt; jmp 1b
  const uint16_t port = ES_DEBUG_FAULT;
  const uint8_t code[] = {0xb8,
                          vector,
                          0,
                          0,
                          0,
                          0x66,
                          0xba,
                          static_cast<uint8_t>(port & 0xff),
                          static_cast<uint8_t>(port >> 8),
                          0xef,
                          0xf4,
                          0xeb,
                          0xfd};
  std::memcpy(out, code, sizeof(code));
}

Status BuildTables(GuestMemory& mem, uint32_t num_vcpus, std::span<const PortRange> ports) {
  if (num_vcpus == 0 || num_vcpus > ES_MAX_VCPUS)
    return Fail(ErrorCode::kInvalidArgument, "vCPU count " + std::to_string(num_vcpus) +
                                                 " out of range (1.." +
                                                 std::to_string(ES_MAX_VCPUS) + ")");
  if (mem.size() < ES_MIN_MEM_SIZE)
    return Fail(ErrorCode::kInvalidArgument,
                "guest memory of " + std::to_string(mem.size()) + " bytes is below the " +
                    std::to_string(ES_MIN_MEM_SIZE) + " the user64 layout needs");
  // Page tables: PML4[0] -> PDPT; PDPT[0..3] -> 4 PDs of 2 MiB pages: identity 0..4 GiB.
  bool ok = mem.WriteObj<uint64_t>(ES_PML4_ADDR, ES_PDPT_ADDR | kPageFlagsTable);
  for (uint64_t i = 0; i < 4; ++i) {
    const uint64_t pd = ES_PD_ADDR + i * 0x1000;
    ok &= mem.WriteObj<uint64_t>(ES_PDPT_ADDR + i * 8, pd | kPageFlagsTable);
    for (uint64_t j = 0; j < 512; ++j)
      ok &= mem.WriteObj<uint64_t>(pd + j * 8, (i << 30 | j << 21) | kPageFlags2M);
  }
  // IDT and stubs.
  for (uint32_t v = 0; v < 256; ++v) {
    uint8_t stub[16];
    Stub(static_cast<uint8_t>(v), stub);
    ok &= mem.Write(ES_STUBS_ADDR + v * ES_STUB_SIZE, stub, sizeof(stub));
    uint8_t ist = 0;
    for (uint8_t iv : kIst1Vectors) ist |= (iv == v) ? 1 : 0;
    uint64_t gate[2];
    IdtGate(ES_STUBS_ADDR + v * ES_STUB_SIZE, ist, gate);
    ok &= mem.Write(ES_IDT_ADDR + v * 16, gate, sizeof(gate));
  }
  // I/O permission bitmap: 1 = #GP, 0 = allowed (then KVM_EXIT_IO); trailing 0xff.
  std::vector<uint8_t> iomap(8192 + 1, 0xff);
  for (const PortRange& r : ports)
    for (uint32_t p = r.base; p < static_cast<uint32_t>(r.base) + r.count && p < 0x10000; ++p)
      iomap[p / 8] &= static_cast<uint8_t>(~(1u << (p % 8)));
  for (uint32_t c = 0; c < num_vcpus; ++c) {
    const uint64_t gdt = GdtAddr(c);
    uint64_t tss_desc[2];
    TssDescriptor(TssAddr(c), ES_TSS_LIMIT, tss_desc);
    const uint64_t entries[8] = {0,           kGdtCode0,   kGdtData0, 0,
                                 tss_desc[0], tss_desc[1], kGdtCode3, kGdtData3};
    ok &= mem.Write(gdt, entries, sizeof(entries));
    uint8_t tss[ES_TSS_IOMAP_OFFSET] = {};
    const uint64_t rsp0 = Rsp0(c), ist1 = Ist1(c);
    const uint16_t iomap_base = ES_TSS_IOMAP_OFFSET;
    std::memcpy(tss + 4, &rsp0, 8);   // RSP0
    std::memcpy(tss + 36, &ist1, 8);  // IST1
    std::memcpy(tss + 102, &iomap_base, 2);
    ok &= mem.Write(TssAddr(c), tss, sizeof(tss));
    ok &= mem.Write(TssAddr(c) + ES_TSS_IOMAP_OFFSET, iomap.data(), iomap.size());
  }
  if (!ok) return Fail(ErrorCode::kInternal, "user64 tables do not fit in guest memory");
  return {};
}

namespace {
kvm_segment Segment(uint16_t selector, uint8_t type, uint8_t dpl, bool code64) {
  kvm_segment s{};
  s.base = 0;
  s.limit = 0xffffffff;
  s.selector = selector;
  s.type = type;
  s.present = 1;
  s.dpl = dpl;
  s.db = code64 ? 0 : 1;
  s.s = 1;
  s.l = code64 ? 1 : 0;
  s.g = 1;
  return s;
}
}  // namespace

void SetUser64Sregs(uint32_t vcpu, kvm_sregs* s) {
  s->cs = Segment(kSelCode3, 0xb, 3, true);
  s->ds = s->es = s->fs = s->gs = s->ss = Segment(kSelData3, 0x3, 3, false);
  s->tr = kvm_segment{};
  s->tr.base = TssAddr(vcpu);
  s->tr.limit = ES_TSS_LIMIT;
  s->tr.selector = kSelTss;
  s->tr.type = 0xb;  // busy 64-bit TSS
  s->tr.present = 1;
  s->ldt = kvm_segment{};
  s->ldt.type = 0x2;
  s->ldt.unusable = 1;
  s->gdt.base = GdtAddr(vcpu);
  s->gdt.limit = 8 * 8 - 1;
  s->idt.base = ES_IDT_ADDR;
  s->idt.limit = 256 * 16 - 1;
  s->cr0 = kCr0;
  s->cr3 = ES_PML4_ADDR;
  s->cr4 = kCr4;
  s->efer = kEfer;
}

kvm_regs User64Regs(uint64_t entry, uint32_t vcpu, uint32_t num_vcpus, uint64_t arg) {
  kvm_regs r{};
  r.rip = entry;
  r.rsp = UserStackTop(vcpu);
  r.rdi = vcpu;
  r.rsi = num_vcpus;
  r.rdx = arg;
  r.rflags = kRflags;
  return r;
}

}  // namespace exitscope::vmm::x86
