/* guests/lib/guest.h: the freestanding runtime every guest links (port and MMIO access,
 * UART output, the debug-exit protocol, halting through the CPL0 `int3` stub). */
#ifndef EXITSCOPE_GUESTS_LIB_GUEST_H_
#define EXITSCOPE_GUESTS_LIB_GUEST_H_

#include "../abi.h"

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

/* Implemented by each guest: the return value goes to ES_DEBUG_EXIT (0 = pass). */
int guest_main(u32 vcpu, u32 nvcpus, u64 arg);

static inline void outb(u16 port, u8 v) {
  __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port));
}
static inline void outl(u16 port, u32 v) {
  __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port));
}
static inline u8 inb(u16 port) {
  u8 v;
  __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
  return v;
}
static inline u32 inl(u16 port) {
  u32 v;
  __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port));
  return v;
}
static inline u32 mmio_read32(u64 addr) {
  return *(volatile u32*)addr;
}
static inline u64 mmio_read64(u64 addr) {
  return *(volatile u64*)addr;
}
static inline void mmio_write32(u64 addr, u32 v) {
  *(volatile u32*)addr = v;
}
static inline void mmio_write64(u64 addr, u64 v) {
  *(volatile u64*)addr = v;
}
static inline void cpu_relax(void) {
  __asm__ volatile("pause" ::: "memory");
}
static inline void barrier(void) {
  __asm__ volatile("" ::: "memory");
}

/* HLT from CPL3: `int3` enters the CPL0 stub `hlt; iretq` (KVM_EXIT_HLT in the VMM). */
static inline void halt(void) {
  __asm__ volatile("int3" ::: "memory");
}

static inline void debug_marker(u32 v) {
  outl(ES_DEBUG_MARKER, v);
}
void debug_exit(u32 code) __attribute__((noreturn));

void uart_init(void);
void uart_lock(void);
void uart_unlock(void);
void uart_putc(char c);
void uart_puts(const char* s);
void uart_put_dec(u64 v);
void uart_put_hex(u64 v);
/* One whole line under the UART lock so vCPUs do not interleave. */
void uart_line(const char* a, u64 n1, const char* b, u64 n2, const char* c);

void* memset(void* d, int c, unsigned long n);
void* memcpy(void* d, const void* s, unsigned long n);

#endif
