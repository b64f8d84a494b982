/* c_example: a plain C program using exitscope's C API the way a C VMM would.
 *
 * It has no guest: it plays the part of a VMM's exit handlers, driving the recorder with the
 * calls a vCPU loop would make for a UART (PIO 0x3f8) and an NVMe controller (MMIO
 * 0xfebf0000), a few block I/Os through a "backend", and one deliberately slow doorbell
 * write (a 30 ms handler) that the slow-exit policy reports. The watchdog finds that vCPU stuck
 * (20 ms) and captures its thread's stack, which the hook prints (kernel frames where
 * /proc/self/task/TID/stack is readable, user frames through the stack signal). Then it
 * writes a dump.
 *
 *   build/examples/c_example OUT.esdump
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <exitscope/exitscope.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int findings;

static void on_finding(const es_finding* f, void* user) {
  (void)user;
  ++findings;
  printf("hook: %s\n", f->line);
  /* A stuck vCPU's stack, innermost first: valid during this call only. */
  const es_stack* s = es_finding_stack(f);
  if (s == NULL) return;
  printf("hook:   thread %d, state %c, capture %u\n", (int)s->tid, s->state ? s->state : '?',
         (unsigned)s->capture);
  for (uint32_t i = 0; i < s->n_kernel; ++i)
    printf("hook:   k %s+0x%llx [kernel]\n", s->kernel[i].function,
           (unsigned long long)s->kernel[i].offset);
  for (uint32_t i = 0; i < s->n_user; ++i) {
    const es_frame* fr = &s->user[i];
    if (fr->function[0] == '\0')
      printf("hook:   u 0x%llx [%s]\n", (unsigned long long)fr->ip, fr->module);
    else if (fr->file[0] != '\0')
      printf("hook:   u %s+0x%llx (%s:%u) [%s]\n", fr->function, (unsigned long long)fr->offset,
             fr->file, (unsigned)fr->line, fr->module);
    else
      printf("hook:   u %s+0x%llx [%s]\n", fr->function, (unsigned long long)fr->offset,
             fr->module);
  }
  if (s->note[0] != '\0') printf("hook:   note: %s\n", s->note);
}

/* The stack signal interrupts nanosleep (EINTR): sleep the rest. */
static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

#define CHECK(call)                                                                            \
  do {                                                                                         \
    es_status s_ = (call);                                                                     \
    if (s_ != ES_OK) {                                                                         \
      fprintf(stderr, "c_example: %s: %s (%s)\n", #call, es_last_error(), es_status_name(s_)); \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

int main(int argc, char** argv) {
  const char* out = argc > 1 ? argv[1] : "c_example.esdump";
  es_options opts;
  es_options_init(&opts);
  opts.num_vcpus = 2;
  opts.events_per_vcpu = 1024;
  es_recorder* rec = NULL;
  CHECK(es_recorder_create(&opts, &rec));
  CHECK(es_set_finding_hook(rec, on_finding, NULL));
  /* The watchdog's stack captures unwind a stuck vCPU thread inside this signal's handler. */
  CHECK(es_install_stack_signal(rec, SIGRTMIN + 3));
  CHECK(es_set_attribute(rec, "vmm", "c_example (no guest: simulated exit handlers)"));

  uint32_t uart, nvme;
  CHECK(es_add_device(rec, "uart0", "uart16550", &uart));
  CHECK(es_add_device(rec, "nvme0", "nvme", &nvme));
  CHECK(es_add_range_builtin(rec, ES_SPACE_PIO, 0x3f8, 8, uart, "uart16550"));
  CHECK(es_add_range_builtin(rec, ES_SPACE_MMIO, 0xfebf0000, 0x4000, nvme, "nvme"));

  /* Overlapping registration is refused with a message. */
  uint32_t dup;
  CHECK(es_add_device(rec, "nvme1", "nvme", &dup));
  if (es_add_range_builtin(rec, ES_SPACE_MMIO, 0xfebf2000, 0x4000, dup, "nvme") != ES_EEXIST) {
    fprintf(stderr, "c_example: overlapping range was accepted\n");
    return 1;
  }
  printf("refused: %s\n", es_last_error());

  char name[64];
  CHECK(es_resolve(rec, ES_SPACE_MMIO, 0xfebf1008, 4, ES_DIR_WRITE, name, sizeof name));
  printf("0xfebf1008 -> %s\n", name);

  /* vCPU 0 prints "hello\n" through the UART's THR. */
  const char* msg = "hello\n";
  for (size_t i = 0; i < strlen(msg); ++i) {
    es_begin_exit(rec, 0, ES_EXIT_PIO, 0x3f8, 1, ES_DIR_WRITE, (uint8_t)msg[i]);
    es_end_exit(rec, 0);
  }
  /* vCPU 1 polls CSTS, then rings the SQ1 tail doorbell; the handler submits an I/O. */
  for (int i = 0; i < 100; ++i) {
    es_begin_exit(rec, 1, ES_EXIT_MMIO, 0xfebf001c, 4, ES_DIR_READ, 0);
    es_end_exit_value(rec, 1, 1); /* CSTS.RDY */
  }
  for (uint64_t io = 1; io <= 4; ++io) {
    es_begin_exit(rec, 1, ES_EXIT_MMIO, 0xfebf1008, 4, ES_DIR_WRITE, io);
    es_io_submit(rec, nvme, io);
    if (io == 4) sleep_ms(30); /* a slow doorbell handler: reported as a slow exit */
    es_end_exit(rec, 1);
    es_io_complete(rec, nvme, io, io == 3 ? -5 : 0);
  }
  es_backend_error(rec, nvme, -5, "pwrite: EIO on io 3");
  /* An unregistered address resolves to "unassigned", never a crash. */
  es_begin_exit(rec, 0, ES_EXIT_MMIO, 0xdead0000, 4, ES_DIR_READ, 0);
  es_end_exit_value(rec, 0, 0xffffffffu);

  /* The watchdog's findings (the stall and its stack capture, which takes a few ms to
   * symbolize) are complete once it has stopped: stop it before the dump. */
  es_watchdog_stop(rec);
  es_counters c;
  CHECK(es_get_counters(rec, &c));
  printf("exits recorded: %llu, slow: %llu, findings seen by the hook: %d\n",
         (unsigned long long)c.exits_written, (unsigned long long)c.slow_exits, findings);
  CHECK(es_write_dump(rec, out, 0));
  CHECK(es_check_dump(out));
  printf("dump written: %s\n", out);
  es_recorder_destroy(rec);
  return c.slow_exits == 1 && findings >= 1 ? 0 : 1;
}
