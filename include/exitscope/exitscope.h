/* exitscope/exitscope.h: the C API of the exitscope flight recorder, for VMMs in C or Rust.
 *
 * A hermetic C11 header: opaque handles, plain structs, integer status codes; no C++ type
 * and no exception crosses it. Every call that can fail returns an es_status (ES_OK == 0);
 * es_last_error() then returns a one-line message for the calling thread.
 *
 *   es_options opts;
 *   es_options_init(&opts);  // sets opts.struct_size, then the defaults
 *   opts.num_vcpus = 2;
 *   es_recorder* rec;
 *   if (es_recorder_create(&opts, &rec) != ES_OK) { fprintf(stderr, "%s\n", es_last_error()); }
 *   uint32_t uart;
 *   es_add_device(rec, "uart0", "uart16550", &uart);
 *   es_add_range_builtin(rec, ES_SPACE_PIO, 0x3f8, 8, uart, "uart16550");
 *   // vCPU loop, on KVM_EXIT_IO:
 *   es_begin_exit(rec, vcpu, ES_EXIT_PIO, run->io.port, run->io.size, ES_DIR_WRITE, byte);
 *   handle_io(...);
 *   es_end_exit(rec, vcpu);
 *   es_write_dump(rec, "vm.esdump", 0);
 *   es_recorder_destroy(rec);
 *
 * Hot path: es_begin_exit / es_end_exit / es_end_exit_value are lock-free and allocation-free
 * (one call into the library each). One thread per vCPU index may call them at a time.
 * Everything else is thread-safe. Full guide: docs/capi.md.
 */
#ifndef EXITSCOPE_EXITSCOPE_H_
#define EXITSCOPE_EXITSCOPE_H_

#include <stddef.h>
#include <stdint.h>

#include "exitscope/export.h"
#include "exitscope/version.h"

/* The library is built with hidden visibility; ES_EXPORT marks each C API function. */
#define ES_EXPORT EXITSCOPE_EXPORT

#ifdef __cplusplus
extern "C" {
#endif

typedef struct es_recorder es_recorder;

/* Status codes: 0 success, negative failure (values stable). */
typedef enum es_status {
  ES_OK = 0,
  ES_EINVAL = -1,       /* bad argument or bad input */
  ES_EEXIST = -2,       /* e.g. overlapping range, duplicate device name */
  ES_ENOENT = -3,       /* not found */
  ES_ECORRUPT = -4,     /* malformed or truncated file */
  ES_EUNSUPPORTED = -5, /* e.g. a dump from a newer exitscope */
  ES_EIO = -6,          /* read/write failure */
  ES_EUNAVAILABLE = -7, /* facility missing */
  ES_EPERM = -8,
  ES_EINTERNAL = -9,
  ES_ENOMEM = -10,
} es_status;

/* Values equal the C++ exitscope::ExitKind / AccessDir / IoSpace. */
typedef enum es_exit_kind {
  ES_EXIT_UNKNOWN = 0,
  ES_EXIT_MMIO = 1,
  ES_EXIT_PIO = 2,
  ES_EXIT_HLT = 3,
  ES_EXIT_SHUTDOWN = 4,
  ES_EXIT_INTR = 5,
  ES_EXIT_HYPERCALL = 6,
  ES_EXIT_MSR = 7,
  ES_EXIT_DEBUG = 8,
  ES_EXIT_SYSTEM_EVENT = 9,
  ES_EXIT_INTERNAL_ERROR = 10,
  ES_EXIT_FAIL_ENTRY = 11,
  ES_EXIT_OTHER = 12,
} es_exit_kind;

typedef enum es_dir { ES_DIR_NONE = 0, ES_DIR_READ = 1, ES_DIR_WRITE = 2 } es_dir;
typedef enum es_space { ES_SPACE_MMIO = 0, ES_SPACE_PIO = 1 } es_space;

#define ES_UNASSIGNED 0xffffffffu

/* Creation options. Initialise with es_options_init, then change what you need.
 * The struct can grow: new fields are only ever appended, and struct_size (the caller's
 * sizeof(es_options), set by es_options_init) tells the library which ones the caller knows.
 * Fields past a smaller struct_size take their defaults; a larger one (a newer header than the
 * library) is accepted when the fields this library does not know are zero (docs/capi.md,
 * "Compatibility"). */
typedef struct es_options {
  uint32_t struct_size;     /* sizeof(es_options) as the caller was compiled; es_options_init */
  uint32_t num_vcpus;       /* default 1 */
  uint64_t events_per_vcpu; /* ring capacity per vCPU, default 4096 */
  uint64_t device_events;   /* device-event ring capacity, default 4096 */
  uint64_t slow_exit_ns;    /* slow-exit threshold, default 20 ms */
  uint64_t stuck_exit_ns;   /* watchdog: vCPU inside one exit this long, default 20 ms */
  uint64_t io_age_ns;       /* watchdog: I/O in flight this long, default 20 s */
  int start_watchdog;       /* default 1 */
  int log_slow_exits;       /* log one line per slow exit / finding, default 1 */
} es_options;

/* A slow exit or a watchdog finding, passed to hooks. Strings valid during the call only. */
typedef enum es_event_type {
  ES_STUCK_EXIT = 0,       /* a vCPU has been inside one exit past the threshold (still inside) */
  ES_STUCK_EXIT_END = 1,   /* that exit ended; duration_ns is its total */
  ES_AGED_IO = 2,          /* an I/O has been in flight past io_age_ns */
  ES_SLOW_EXIT = 3,        /* an exit ended after at least slow_exit_ns */
  ES_STUCK_EXIT_STACK = 4, /* a later stack capture of a vCPU still stuck (4x, 16x the threshold) */
} es_event_type;

typedef struct es_finding {
  es_event_type type;
  uint32_t vcpu;
  es_exit_kind kind;
  es_dir dir;
  uint8_t size;
  uint64_t addr;
  uint64_t duration_ns;
  uint64_t io_id;
  const char* device; /* "" when unassigned */
  const char* reg;    /* "" when none */
  const char* line;   /* the log line */
} es_finding;

typedef void (*es_finding_hook)(const es_finding* finding, void* user);

/* One frame of a captured stack (docs/stacks.md). Strings are never NULL ("" when unknown). */
typedef struct es_frame {
  uint64_t ip;          /* the instruction (first user frame) or the return address */
  uint64_t offset;      /* ip - the function's start; 0 when unresolved */
  const char* function; /* demangled, "" when unresolved */
  const char* module;   /* "/usr/lib/x86_64-linux-gnu/libc.so.6", "[kernel]" */
  const char* file;     /* source file where DWARF says, else "" */
  uint32_t line;        /* 0 when unknown */
} es_frame;

/* What a stuck vCPU thread was doing when the watchdog captured it: its frames, innermost
 * first (a thread in a system call: the kernel frames are the innermost), its /proc state and
 * why something is missing. Library memory, read-only. */
typedef struct es_stack {
  int32_t tid;           /* the thread captured */
  char state;            /* /proc state letter ('R', 'S', 'D', ...), 0 when unknown */
  uint32_t capture;      /* 1, 2, 3...: which capture of this stall (1 = when found stuck) */
  uint32_t user_dropped; /* user frames beyond the capture's limit, not kept */
  uint32_t n_user;
  const es_frame* user; /* n_user frames */
  uint32_t n_kernel;
  const es_frame* kernel; /* n_kernel frames; none where /proc/self/task/TID/stack is unreadable */
  const char* note;       /* why something is missing, one line; "" when nothing is */
} es_stack;

/* The stack captured with `finding` (ES_STUCK_EXIT, ES_STUCK_EXIT_STACK) when `finding` is the
 * argument of the finding hook running on this thread; NULL when it has none (no capture was
 * made: another type, captures off, the vCPU's thread not known yet) or for any other pointer.
 * Valid during the hook call only, like the finding's strings. */
ES_EXPORT const es_stack* es_finding_stack(const es_finding* finding);

typedef struct es_counters {
  uint64_t exits_written;     /* records written into all vCPU rings */
  uint64_t exits_overwritten; /* oldest records overwritten (ring full) */
  uint64_t exits_skipped;     /* torn records skipped by snapshots */
  uint64_t device_events_written;
  uint64_t device_events_overwritten;
  uint64_t slow_exits;
  uint64_t bad_vcpu;
  uint64_t end_without_begin;
  uint64_t begin_without_end;
  uint64_t io_in_flight;
} es_counters;

ES_EXPORT const char* es_last_error(void);
ES_EXPORT const char* es_status_name(es_status s);

/* The loaded library's version, "MAJOR.MINOR.PATCH" (the headers': ES_VERSION_STRING). */
ES_EXPORT const char* es_version(void);
/* The same as ES_VERSION_ENCODE(major, minor, patch) (exitscope/version.h). */
ES_EXPORT uint32_t es_version_number(void);

/* Fills the first `size` bytes of *opts: zeroes, then every default this library knows, and
 * struct_size = size. ES_EINVAL for NULL or a size smaller than the first es_options layout.
 * Call it through es_options_init, which passes the caller's sizeof(es_options). */
ES_EXPORT es_status es_options_init_sized(es_options* opts, size_t size);
static inline void es_options_init(es_options* opts) {
  (void)es_options_init_sized(opts, sizeof(*opts));
}
/* opts NULL: the defaults. ES_EINVAL when opts->struct_size is smaller than the first layout
 * (options not initialised with es_options_init); ES_EUNSUPPORTED when it is larger than this
 * library's and a field it does not know is not zero. */
ES_EXPORT es_status es_recorder_create(const es_options* opts, es_recorder** out);
ES_EXPORT void es_recorder_destroy(es_recorder* rec); /* NULL is a no-op */

/* Address space. */
ES_EXPORT es_status es_add_device(es_recorder* rec, const char* name, const char* kind,
                                  uint32_t* out_index);
/* Maps [base, base+size) of `space` to device; map_name: a builtin register map ("nvme",
 * "uart16550", ...) or NULL for none. */
ES_EXPORT es_status es_add_range_builtin(es_recorder* rec, es_space space, uint64_t base,
                                         uint64_t size, uint32_t device, const char* map_name);
/* Same with a register map loaded from a map file (docs/recorder.md has the format). */
ES_EXPORT es_status es_add_range_file(es_recorder* rec, es_space space, uint64_t base,
                                      uint64_t size, uint32_t device, const char* map_path);
ES_EXPORT es_status es_remove_range(es_recorder* rec, es_space space, uint64_t base);
/* Resolves an access to "device.REGISTER" (or "device+0xOFF", or "unassigned") into buf. */
ES_EXPORT es_status es_resolve(const es_recorder* rec, es_space space, uint64_t addr, uint32_t size,
                               es_dir dir, char* buf, size_t buf_len);

/* Hot path. `value` is the guest's data for writes; es_end_exit_value records the data
 * returned to the guest for reads.
 * es_begin_exit returns ES_OK (also for a NULL recorder: a no-op), or ES_EINVAL for a kind outside
 * ES_EXIT_UNKNOWN..ES_EXIT_OTHER: such an exit is still timed, recorded as ES_EXIT_UNKNOWN
 * (so the es_end_exit that follows pairs with it), and es_last_error() names the bad kind.
 * A bad `dir` is recorded as ES_DIR_NONE. */
ES_EXPORT es_status es_begin_exit(es_recorder* rec, uint32_t vcpu, es_exit_kind kind, uint64_t addr,
                                  uint8_t size, es_dir dir, uint64_t value);
ES_EXPORT void es_end_exit(es_recorder* rec, uint32_t vcpu);
ES_EXPORT void es_end_exit_value(es_recorder* rec, uint32_t vcpu, uint64_t value);

/* Device events (any thread). */
ES_EXPORT void es_io_submit(es_recorder* rec, uint32_t device, uint64_t io_id);
ES_EXPORT void es_io_complete(es_recorder* rec, uint32_t device, uint64_t io_id, int64_t status);
ES_EXPORT void es_queue_full(es_recorder* rec, uint32_t device, uint64_t queue);
ES_EXPORT void es_backend_error(es_recorder* rec, uint32_t device, int64_t error, const char* note);
ES_EXPORT void es_note(es_recorder* rec, uint32_t device, const char* text);

/* Policy and watchdog. The hook runs on the vCPU thread (slow exits) or the watchdog thread. */
ES_EXPORT es_status es_set_slow_exit_ns(es_recorder* rec, uint64_t threshold_ns);
ES_EXPORT es_status es_set_finding_hook(es_recorder* rec, es_finding_hook hook, void* user);
ES_EXPORT es_status es_watchdog_start(es_recorder* rec, uint64_t stuck_exit_ns, uint64_t io_age_ns);
ES_EXPORT void es_watchdog_stop(es_recorder* rec);

/* Stack captures of stuck vCPU threads (docs/stacks.md). The watchdog captures the thread it
 * finds stuck inside an exit: its /proc state and kernel stack, and, with a stack signal
 * installed, its user stack, unwound inside the thread by the signal's handler.
 * es_set_thread_id: the vCPU's thread id (gettid()); without it the recorder takes the id of
 * the thread that makes the vCPU's first exit. ES_EINVAL for a bad vCPU or tid <= 0.
 * es_install_stack_signal: installs the handler of real-time signal `signo`
 * (SIGRTMIN..SIGRTMAX); one recorder per process owns it (ES_EEXIST otherwise); restored when
 * the recorder is destroyed. nanosleep and KVM_RUN return EINTR when it arrives: retry them. */
ES_EXPORT es_status es_set_thread_id(es_recorder* rec, uint32_t vcpu, int32_t tid);
ES_EXPORT es_status es_install_stack_signal(es_recorder* rec, int signo);

/* Metadata carried in dumps. */
ES_EXPORT es_status es_set_attribute(es_recorder* rec, const char* key, const char* value);
ES_EXPORT es_status es_set_vcpu_counter(es_recorder* rec, uint32_t vcpu, const char* name,
                                        uint64_t value);

/* Dumps. include_guest_data != 0 writes the bytes guests wrote/read (off by default: dumps
 * travel in support bundles). Large rings are coded on several threads (one per 65536
 * records held, at most one per online CPU and 8; Recorder::WriteDump, docs/recorder.md). */
ES_EXPORT es_status es_write_dump(const es_recorder* rec, const char* path, int include_guest_data);
ES_EXPORT es_status es_install_dump_signal(es_recorder* rec, int signo, const char* directory);
ES_EXPORT es_status es_get_counters(const es_recorder* rec, es_counters* out);
/* Validates a dump file: ES_OK, or ES_ECORRUPT / ES_EUNSUPPORTED / ES_EIO with a message. */
ES_EXPORT es_status es_check_dump(const char* path);

/* A Prometheus endpoint over the recorder (GET /metrics; metric names in docs/prometheus.md).
 * A collector thread reads the rings; the vCPUs' hot path is unchanged. `listen` is
 * "ADDR:PORT" (IPv4) or ":PORT" (= 127.0.0.1:PORT); NULL = "127.0.0.1:9464"; port 0 picks a
 * free port (es_metrics_port). ES_EINVAL for a bad address, ES_EIO when it cannot be bound.
 * Stop it with es_metrics_stop (up to ~2 s: civetweb's poll period) before es_recorder_destroy. */
typedef struct es_metrics es_metrics;
ES_EXPORT es_status es_serve_metrics(const es_recorder* rec, const char* listen, es_metrics** out);
ES_EXPORT uint16_t es_metrics_port(const es_metrics* metrics); /* 0 for NULL */
ES_EXPORT void es_metrics_stop(es_metrics* metrics);           /* NULL is a no-op */

#ifdef __cplusplus
}
#endif

#endif /* EXITSCOPE_EXITSCOPE_H_ */
