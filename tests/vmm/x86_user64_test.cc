// The user64 tables, checked byte for byte against the recipe (docs/host-facts.md section 1).
#include "vmm/x86_user64.h"

#include <gtest/gtest.h>

#include <cstring>

#include "guests/abi.h"

namespace exitscope::vmm::x86 {
namespace {

uint64_t Q(const GuestMemory& m, uint64_t gpa) {
  uint64_t v = 0;
  EXPECT_TRUE(m.ReadObj(gpa, &v));
  return v;
}

class User64Tables : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = GuestMemory::Create(ES_DEFAULT_MEM_SIZE);
    ASSERT_TRUE(m) << m.error().message;
    mem = std::move(*m);
    const PortRange ports[] = {{ES_UART_PORT, 8}, {ES_DEBUG_PORT, 16}};
    auto st = BuildTables(mem, 3, ports);
    ASSERT_TRUE(st) << st.error().message;
  }
  GuestMemory mem;
};

TEST_F(User64Tables, PageTablesIdentityMapFourGiBWithUserBitOnEveryLevel) {
  EXPECT_EQ(Q(mem, ES_PML4_ADDR), ES_PDPT_ADDR | 0x7);
  EXPECT_EQ(Q(mem, ES_PML4_ADDR + 8), 0u);  // nothing above 512 GiB
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(Q(mem, ES_PDPT_ADDR + 8 * i), (ES_PD_ADDR + 0x1000 * i) | 0x7);
    for (uint64_t j : {0ull, 1ull, 255ull, 511ull}) {
      const uint64_t pde = Q(mem, ES_PD_ADDR + 0x1000 * i + 8 * j);
      EXPECT_EQ(pde, ((i << 30) | (j << 21)) | 0x87) << i << "/" << j;
      EXPECT_TRUE(pde & 0x4) << "U/S missing";
      EXPECT_TRUE(pde & 0x80) << "2 MiB page";
    }
  }
  EXPECT_EQ(Q(mem, ES_PDPT_ADDR + 8 * 4), 0u);
  // The NVMe registers' page is mapped (identity), so MMIO there exits as KVM_EXIT_MMIO.
  const uint64_t nvme_pde = Q(mem, ES_PD_ADDR + 0x1000 * 3 + 8 * ((ES_NVME_BASE >> 21) & 511));
  EXPECT_EQ(nvme_pde & ~0xfffull, ES_NVME_BASE & ~((1ull << 21) - 1));
}

TEST_F(User64Tables, GdtHasTheRecipeDescriptorsPerVcpu) {
  for (uint32_t c = 0; c < 3; ++c) {
    const uint64_t g = GdtAddr(c);
    EXPECT_EQ(g, ES_GDT_ADDR + c * ES_GDT_STRIDE);
    EXPECT_EQ(Q(mem, g + 0x00), 0u);
    EXPECT_EQ(Q(mem, g + 0x08), 0x00af9b000000ffffull);
    EXPECT_EQ(Q(mem, g + 0x10), 0x00cf93000000ffffull);
    EXPECT_EQ(Q(mem, g + 0x30), 0x00affb000000ffffull);
    EXPECT_EQ(Q(mem, g + 0x38), 0x00cff3000000ffffull);
    // 0x30: DPL 3 (bits 45-46), L (bit 53), present (bit 47), code (type 0xb).
    const uint64_t code3 = Q(mem, g + 0x30);
    EXPECT_EQ((code3 >> 45) & 3, 3u);
    EXPECT_EQ((code3 >> 53) & 1, 1u);
    // TSS descriptor at 0x20: base, limit, type 0x9 present.
    const uint64_t lo = Q(mem, g + 0x20), hi = Q(mem, g + 0x28);
    const uint64_t base = ((lo >> 16) & 0xffffff) | (((lo >> 56) & 0xff) << 24) | (hi << 32);
    const uint64_t limit = (lo & 0xffff) | (((lo >> 48) & 0xf) << 16);
    EXPECT_EQ(base, TssAddr(c));
    EXPECT_EQ(limit, static_cast<uint64_t>(ES_TSS_LIMIT));
    EXPECT_EQ((lo >> 40) & 0xff, 0x89u);
  }
}

TEST_F(User64Tables, TssHasStacksAndAnIoBitmapAllowingOnlyDevicePorts) {
  for (uint32_t c = 0; c < 3; ++c) {
    const uint64_t t = TssAddr(c);
    uint8_t tss[0x68];
    ASSERT_TRUE(mem.Read(t, tss, sizeof(tss)));
    uint64_t rsp0, ist1;
    uint16_t iomap;
    std::memcpy(&rsp0, tss + 4, 8);
    std::memcpy(&ist1, tss + 36, 8);
    std::memcpy(&iomap, tss + 102, 2);
    EXPECT_EQ(rsp0, Rsp0(c));
    EXPECT_EQ(ist1, Ist1(c));
    EXPECT_NE(rsp0, ist1);
    EXPECT_EQ(iomap, 0x68);
    auto allowed = [&](uint32_t port) {
      uint8_t b = 0;
      EXPECT_TRUE(mem.ReadObj(t + 0x68 + port / 8, &b));
      return (b & (1u << (port % 8))) == 0;
    };
    for (uint32_t p = 0x3f8; p < 0x400; ++p) EXPECT_TRUE(allowed(p)) << std::hex << p;
    for (uint32_t p = 0x500; p < 0x510; ++p) EXPECT_TRUE(allowed(p)) << std::hex << p;
    for (uint32_t p : {0x0u, 0x80u, 0x3f7u, 0x400u, 0x4ffu, 0x510u, 0xcf8u, 0xffffu})
      EXPECT_FALSE(allowed(p)) << std::hex << p;
    uint8_t trailing = 0;
    ASSERT_TRUE(mem.ReadObj(t + 0x68 + 8192, &trailing));
    EXPECT_EQ(trailing, 0xff);
  }
  // Per-vCPU stacks never overlap.
  EXPECT_LT(Ist1(0), Rsp0(1) - 0x1000);
  EXPECT_LE(Ist1(ES_MAX_VCPUS - 1), ES_GUEST_LOAD_ADDR);
  EXPECT_LE(TssAddr(ES_MAX_VCPUS - 1) + ES_TSS_LIMIT + 1, ES_KSTACK_ADDR);
}

TEST_F(User64Tables, IdtHas256UserCallableGatesToCpl0Stubs) {
  for (uint32_t v = 0; v < 256; ++v) {
    const uint64_t lo = Q(mem, ES_IDT_ADDR + 16 * v), hi = Q(mem, ES_IDT_ADDR + 16 * v + 8);
    const uint64_t handler = (lo & 0xffff) | (((lo >> 48) & 0xffff) << 16) | (hi << 32);
    EXPECT_EQ(handler, ES_STUBS_ADDR + ES_STUB_SIZE * v);
    EXPECT_EQ((lo >> 16) & 0xffff, 0x08u);  // CPL0 code selector
    EXPECT_EQ((lo >> 40) & 0xff, 0xeeu);
    const uint64_t ist = (lo >> 32) & 7;
    EXPECT_EQ(ist, (v == 2 || v == 8 || v == 18) ? 1u : 0u) << v;
  }
}

TEST_F(User64Tables, Int3StubHaltsAndReturnsOthersReportTheirVector) {
  uint8_t stub[16];
  ASSERT_TRUE(mem.Read(ES_STUBS_ADDR + 3 * ES_STUB_SIZE, stub, 16));
  EXPECT_EQ(stub[0], 0xf4);  // hlt
  EXPECT_EQ(stub[1], 0x48);  // iretq
  EXPECT_EQ(stub[2], 0xcf);
  ASSERT_TRUE(mem.Read(ES_STUBS_ADDR + 13 * ES_STUB_SIZE, stub, 16));
  const uint8_t gp[] = {0xb8, 13, 0, 0, 0, 0x66, 0xba, 0x08, 0x05, 0xef, 0xf4, 0xeb, 0xfd};
  EXPECT_EQ(0, std::memcmp(stub, gp, sizeof(gp)));
}

TEST(User64Registers, SregsFollowTheRecipe) {
  kvm_sregs s{};
  s.apic_base = 0xfee00900;
  SetUser64Sregs(2, &s);
  EXPECT_EQ(s.cr0, 0x80050033u);
  EXPECT_EQ(s.cr4, 0x620u);
  EXPECT_EQ(s.efer, 0x501u);
  EXPECT_EQ(s.cr3, ES_PML4_ADDR);
  EXPECT_EQ(s.cs.selector, 0x33);
  EXPECT_EQ(s.cs.dpl, 3);
  EXPECT_EQ(s.cs.l, 1);
  EXPECT_EQ(s.cs.db, 0);
  EXPECT_EQ(s.cs.type, 0xb);
  for (const kvm_segment* d : {&s.ds, &s.es, &s.fs, &s.gs, &s.ss}) {
    EXPECT_EQ(d->selector, 0x3b);
    EXPECT_EQ(d->dpl, 3);
    EXPECT_EQ(d->present, 1);
  }
  EXPECT_EQ(s.tr.selector, 0x20);
  EXPECT_EQ(s.tr.base, TssAddr(2));
  EXPECT_EQ(s.tr.limit, static_cast<uint32_t>(ES_TSS_LIMIT));
  EXPECT_EQ(s.tr.type, 0xb);
  EXPECT_EQ(s.ldt.unusable, 1);
  EXPECT_EQ(s.gdt.base, GdtAddr(2));
  EXPECT_EQ(s.gdt.limit, 63);
  EXPECT_EQ(s.idt.base, ES_IDT_ADDR);
  EXPECT_EQ(s.idt.limit, 4095);
  EXPECT_EQ(s.apic_base, 0xfee00900u);  // untouched
}

TEST(User64Registers, EntryRegistersCarryTheVcpuIndex) {
  const kvm_regs r = User64Regs(ES_GUEST_LOAD_ADDR, 3, 4, 77);
  EXPECT_EQ(r.rip, ES_GUEST_LOAD_ADDR);
  EXPECT_EQ(r.rdi, 3u);
  EXPECT_EQ(r.rsi, 4u);
  EXPECT_EQ(r.rdx, 77u);
  EXPECT_EQ(r.rsp, ES_USTACK_ADDR + 4 * ES_USTACK_STRIDE);
  EXPECT_EQ(r.rflags, 0x202u);
}

TEST(User64Tables2, RejectsBadVcpuCountsAndSmallMemory) {
  auto small = GuestMemory::Create(4 << 20);
  ASSERT_TRUE(small);
  EXPECT_FALSE(BuildTables(*small, 1, {}));
  auto m = GuestMemory::Create(ES_DEFAULT_MEM_SIZE);
  ASSERT_TRUE(m);
  EXPECT_FALSE(BuildTables(*m, 0, {}));
  EXPECT_FALSE(BuildTables(*m, ES_MAX_VCPUS + 1, {}));
  EXPECT_TRUE(BuildTables(*m, ES_MAX_VCPUS, {}));
}

}  // namespace
}  // namespace exitscope::vmm::x86
