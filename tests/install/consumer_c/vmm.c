/* A C VMM's vCPU loop reduced to one exit, built against an installed exitscope with
 * pkg-config (cc vmm.c $(pkg-config --cflags --libs exitscope)). vmm_c OUT.esdump */
#include <stdio.h>

#include "exitscope/exitscope.h"

int main(int argc, char** argv) {
  es_options opts;
  es_recorder* rec = NULL;
  es_counters c;
  uint32_t uart = 0;
  if (argc != 2) return 2;
  es_options_init(&opts);
  opts.start_watchdog = 0;
  if (es_recorder_create(&opts, &rec) != ES_OK ||
      es_add_device(rec, "uart0", "uart16550", &uart) != ES_OK ||
      es_add_range_builtin(rec, ES_SPACE_PIO, 0x3f8, 8, uart, "uart16550") != ES_OK ||
      es_begin_exit(rec, 0, ES_EXIT_PIO, 0x3f8, 1, ES_DIR_WRITE, 'x') != ES_OK) {
    fprintf(stderr, "vmm_c: %s\n", es_last_error());
    return 1;
  }
  es_end_exit(rec, 0);
  if (es_write_dump(rec, argv[1], 0) != ES_OK || es_get_counters(rec, &c) != ES_OK) {
    fprintf(stderr, "vmm_c: %s\n", es_last_error());
    return 1;
  }
  es_recorder_destroy(rec);
  printf("vmm_c: exitscope %s (headers %s): %llu exit recorded, dump %s\n", es_version(),
         ES_VERSION_STRING, (unsigned long long)c.exits_written, argv[1]);
  return c.exits_written == 1 ? 0 : 1;
}
