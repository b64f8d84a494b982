/* hello: each vCPU greets through the UART (checking the scratch register first) and passes. */
#include "lib/guest.h"

static volatile u32 arrived;
static volatile u32 uart_ready;

int guest_main(u32 vcpu, u32 nvcpus, u64 arg) {
  (void)arg;
  /* vCPU 0 programs the UART (DLAB on, divisor, DLAB off) before anyone writes: a THR write
   * that lands while DLAB is set goes to the divisor latch and the character is lost. */
  if (vcpu == 0) {
    uart_init();
    __atomic_store_n(&uart_ready, 1, __ATOMIC_RELEASE);
  } else {
    while (!__atomic_load_n(&uart_ready, __ATOMIC_ACQUIRE)) cpu_relax();
  }
  /* The scratch register must hold what was written (16550: offset 7). */
  uart_lock();
  outb(ES_UART_PORT + 7, (u8)(0xa5 ^ vcpu));
  u8 scr = inb(ES_UART_PORT + 7);
  uart_unlock();
  if (scr != (u8)(0xa5 ^ vcpu)) return ES_FAIL_UART;
  if (inl(ES_DEBUG_INFO) != ES_DEBUG_MAGIC) return ES_FAIL_GENERIC;
  uart_line("hello from vCPU ", vcpu, " of ", nvcpus, "");
  __atomic_add_fetch(&arrived, 1, __ATOMIC_SEQ_CST);
  return 0;
}
