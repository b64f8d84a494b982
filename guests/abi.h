/* guests/abi.h: the contract between the reference VMM (src/vmm) and its guests.
 *
 * Plain C, included by the freestanding guests and by the C++ VMM and its tests. Everything
 * a guest and the VMM must agree on lives here: where the image is loaded, which registers
 * carry the vCPU index at entry, the device addresses, and the debug-exit port protocol.
 *
 * Guest-physical memory (identity-mapped, 2 MiB pages, U/S on every level, 0..4 GiB):
 *
 *   0x0000_1000  PML4            0x0000_2000  PDPT         0x0000_3000..0x6fff  4 x PD
 *   0x0000_7000  IDT (256 gates, type 0xee, selector 0x08)
 *   0x0000_8000  CPL0 stubs, 16 bytes per vector (int3: `hlt; iretq`; others report a fault)
 *   0x0000_9000  GDT per vCPU, 0x40 bytes each (0x08 code0, 0x10 data0, 0x20 TSS,
 *                0x30 code3 -> selector 0x33, 0x38 data3 -> selector 0x3b)
 *   0x0001_0000  TSS per vCPU, stride 0x3000 (0x68 bytes, I/O bitmap at 0x68, 8 KiB + 0xff)
 *   0x0004_0000  CPL0 stacks per vCPU, 16 KiB each: RSP0 top at +8 KiB, IST1 top at +16 KiB
 *   0x0040_0000  guest image (flat binary, entry at its first byte), at most 4 MiB incl. bss
 *   0x0080_0000  CPL3 stacks per vCPU, 64 KiB each
 *
 * At entry (CPL3, 64-bit): rip = ES_GUEST_LOAD_ADDR, rdi = vCPU index, rsi = vCPU count,
 * rdx = guest argument (0 = the guest's default), rsp = top of the vCPU's stack.
 */
#ifndef EXITSCOPE_GUESTS_ABI_H_
#define EXITSCOPE_GUESTS_ABI_H_

#define ES_MAX_VCPUS 16

#define ES_PML4_ADDR 0x1000ull
#define ES_PDPT_ADDR 0x2000ull
#define ES_PD_ADDR 0x3000ull /* 4 page directories, 0x3000..0x6fff */
#define ES_IDT_ADDR 0x7000ull
#define ES_STUBS_ADDR 0x8000ull
#define ES_STUB_SIZE 16
#define ES_GDT_ADDR 0x9000ull
#define ES_GDT_STRIDE 0x40ull
#define ES_TSS_ADDR 0x10000ull
#define ES_TSS_STRIDE 0x3000ull
#define ES_TSS_IOMAP_OFFSET 0x68
#define ES_TSS_LIMIT (0x68 + 8192) /* bitmap for 65536 ports + the trailing 0xff byte */
#define ES_KSTACK_ADDR 0x40000ull
#define ES_KSTACK_STRIDE 0x4000ull
#define ES_GUEST_LOAD_ADDR 0x400000ull
#define ES_GUEST_MAX_SIZE 0x400000ull
#define ES_USTACK_ADDR 0x800000ull
#define ES_USTACK_STRIDE 0x10000ull
#define ES_MIN_MEM_SIZE (ES_USTACK_ADDR + ES_MAX_VCPUS * ES_USTACK_STRIDE)
#define ES_DEFAULT_MEM_SIZE (32ull << 20)

/* Devices. */
#define ES_UART_PORT 0x3f8                  /* 16550, 8 ports */
#define ES_DEBUG_PORT 0x500                 /* debug-exit device, 16 ports */
#define ES_DEBUG_EXIT (ES_DEBUG_PORT + 0)   /* 4B write: this vCPU is done, value 0 = pass */
#define ES_DEBUG_MARKER (ES_DEBUG_PORT + 4) /* 4B write: a marker (recorded as a note) */
#define ES_DEBUG_FAULT (ES_DEBUG_PORT + 8)  /* 4B write by the CPL0 fault stubs: vector */
#define ES_DEBUG_INFO (ES_DEBUG_PORT + 12)  /* 4B read: 0x45534447 ("ESDG") */
#define ES_DEBUG_MAGIC 0x45534447u
#define ES_NVME_BASE 0xfebf0000ull /* NVMe-style block device, 8 KiB of registers */
#define ES_NVME_SIZE 0x2000ull
#define ES_UNASSIGNED_MMIO 0xfe000000ull /* nothing lives here: reads are all ones */

/* Fault codes a guest reports through ES_DEBUG_EXIT (0 = pass). */
#define ES_FAIL_GENERIC 1
#define ES_FAIL_UART 2
#define ES_FAIL_NVME_INIT 3
#define ES_FAIL_NVME_IO 4 /* an I/O completed with an error status */
#define ES_FAIL_VERIFY 5  /* data read back differs from what was written */
#define ES_FAIL_UNASSIGNED 6
#define ES_FAIL_TIMEOUT 7

/* The blk guest's data pattern: 64-bit word w of logical block lba (512-byte blocks) in
 * round r holds ES_BLK_PATTERN(lba, w, r). Tests recompute it from the disk file. */
#define ES_BLK_PATTERN(lba, w, r)                                         \
  ((((unsigned long long)(lba)) << 20) ^ ((unsigned long long)(w) << 8) ^ \
   (0x9e3779b97f4a7c15ull * ((unsigned long long)(r) + 1)))
/* Each vCPU owns ES_BLK_LBAS_PER_VCPU blocks starting at vcpu * ES_BLK_LBAS_PER_VCPU. */
#define ES_BLK_LBAS_PER_VCPU 2048
#define ES_BLK_IO_LBAS 8 /* 4 KiB per command */

#endif /* EXITSCOPE_GUESTS_ABI_H_ */
