/* mmio-storm: register reads and writes at a high rate across devices. Each iteration reads
 * NVMe CSTS and VS, writes INTMS, reads the UART LSR and writes its scratch register; every
 * 1024th iteration reads an unassigned MMIO address, which must read all ones.
 * arg = iterations per vCPU (default 20000). Five userspace exits per iteration. */
#include "lib/guest.h"

#define NVME_VS 0x08
#define NVME_INTMS 0x0c
#define NVME_CSTS 0x1c

int guest_main(u32 vcpu, u32 nvcpus, u64 arg) {
  (void)nvcpus;
  u64 iterations = arg ? arg : 20000;
  u32 vs = mmio_read32(ES_NVME_BASE + NVME_VS);
  if (vs == 0xffffffffu || vs == 0) return ES_FAIL_GENERIC;
  for (u64 i = 0; i < iterations; ++i) {
    (void)mmio_read32(ES_NVME_BASE + NVME_CSTS);
    if (mmio_read32(ES_NVME_BASE + NVME_VS) != vs) return ES_FAIL_GENERIC;
    mmio_write32(ES_NVME_BASE + NVME_INTMS, 0);
    (void)inb(ES_UART_PORT + 5);
    outb(ES_UART_PORT + 7, (u8)i);
    if ((i & 1023) == 1023 && mmio_read32(ES_UNASSIGNED_MMIO) != 0xffffffffu)
      return ES_FAIL_UNASSIGNED;
  }
  uart_line("mmio-storm: vCPU ", vcpu, " done, iterations ", iterations, "");
  return 0;
}
