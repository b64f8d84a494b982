/* guests/lib/guest.c: UART output and the debug-exit protocol. */
#include "guest.h"

#define UART_THR 0
#define UART_IER 1
#define UART_FCR 2
#define UART_LCR 3
#define UART_MCR 4
#define UART_LSR 5
#define UART_LSR_THRE 0x20

static volatile u32 uart_lock_word;

void* memset(void* d, int c, unsigned long n) {
  u8* p = d;
  while (n--) *p++ = (u8)c;
  return d;
}

void* memcpy(void* d, const void* s, unsigned long n) {
  u8* p = d;
  const u8* q = s;
  while (n--) *p++ = *q++;
  return d;
}

void debug_exit(u32 code) {
  outl(ES_DEBUG_EXIT, code);
  for (;;) halt(); /* the VMM stops this vCPU at the write above */
}

void uart_init(void) {
  outb(ES_UART_PORT + UART_IER, 0);
  outb(ES_UART_PORT + UART_LCR, 0x80); /* DLAB: divisor 1 = 115200 baud */
  outb(ES_UART_PORT + 0, 1);
  outb(ES_UART_PORT + 1, 0);
  outb(ES_UART_PORT + UART_LCR, 0x03); /* 8N1 */
  outb(ES_UART_PORT + UART_FCR, 0x07);
  outb(ES_UART_PORT + UART_MCR, 0x03);
}

void uart_lock(void) {
  while (__atomic_exchange_n(&uart_lock_word, 1, __ATOMIC_ACQUIRE)) cpu_relax();
}

void uart_unlock(void) {
  __atomic_store_n(&uart_lock_word, 0, __ATOMIC_RELEASE);
}

void uart_putc(char c) {
  while (!(inb(ES_UART_PORT + UART_LSR) & UART_LSR_THRE)) cpu_relax();
  outb(ES_UART_PORT + UART_THR, (u8)c);
}

void uart_puts(const char* s) {
  while (*s) uart_putc(*s++);
}

void uart_put_dec(u64 v) {
  char buf[21];
  int i = 20;
  buf[i] = 0;
  do {
    buf[--i] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  uart_puts(buf + i);
}

void uart_put_hex(u64 v) {
  static const char digits[] = "0123456789abcdef";
  char buf[19];
  int i = 18;
  buf[i] = 0;
  do {
    buf[--i] = digits[v & 15];
    v >>= 4;
  } while (v);
  buf[--i] = 'x';
  buf[--i] = '0';
  uart_puts(buf + i);
}

void uart_line(const char* a, u64 n1, const char* b, u64 n2, const char* c) {
  uart_lock();
  if (a) uart_puts(a);
  uart_put_dec(n1);
  if (b) uart_puts(b);
  uart_put_dec(n2);
  if (c) uart_puts(c);
  uart_putc('\n');
  uart_unlock();
}
