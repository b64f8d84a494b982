/* sources/bpf/kvm_stat_abi.h: the maps shared by kvm_stat.bpf.c (the in-kernel side of
 * `exitscope kvm stat --bpf`) and its loader (bpf_kvm_loader.cc, bpf_kvm_maps.cc). Plain C,
 * fixed-width types only: the BPF program includes it after vmlinux.h, C++ after
 * <linux/types.h>.
 *
 * Maps:
 *   ks_key_index    hash  ks_key -> slot           which ks_slots entry holds a key
 *   ks_slots        array [KS_MAX_KEYS] ks_slot    one per exit key: count, sum, min, max, sum
 *                                                  of squares in 128 bits, untimed count, and
 *                                                  its histogram rows (mmap()ed by userspace)
 *   ks_rows         array [KS_MAX_ROWS] ks_row     64 consecutive buckets of one key's
 *                                                  histogram each, the buckets of
 *                                                  base/histogram.h's LatencyHistogram (128
 *                                                  exact values, then 64 linear buckets per
 *                                                  octave: one row per octave)
 *   ks_alloc        array [1] ks_alloc             slots and rows handed out so far
 *   ks_thread_slots array [tid % KS_THREAD_SLOTS] -> ks_thread, and for threads whose slot
 *                   another thread holds:
 *   ks_threads      hash  tid -> ks_thread         the pairing state of every vCPU thread: the
 *                                                  in-flight map (phase != KS_IDLE: an exit
 *                                                  started at exit_ts and not ended yet)
 *   ks_counters     percpu array [1] ks_counters   what was dropped, rare events
 * A key belongs to one thread (its tid is part of it), so one CPU at a time writes its slot
 * and rows: plain adds, no atomics. Per sample the program touches the thread's entry (which
 * caches the slots of its last keys), one slot and one row: array elements, no hash lookups
 * but on a key's first sample.
 */
#ifndef EXITSCOPE_SOURCES_BPF_KVM_STAT_ABI_H_
#define EXITSCOPE_SOURCES_BPF_KVM_STAT_ABI_H_

/* LatencyHistogram::kBuckets (checked by a static_assert in bpf_kvm_maps.cc). */
#define KS_HIST_SUB_BITS 7
#define KS_HIST_BUCKETS 3776

#define KS_MAX_KEYS 16384
#define KS_ROW_BUCKETS 64 /* buckets per ks_rows entry */
#define KS_KEY_ROWS ((KS_HIST_BUCKETS + KS_ROW_BUCKETS - 1) / KS_ROW_BUCKETS)
#define KS_MAX_ROWS 32768
#define KS_KEY_CACHE 8 /* per thread: the slots of its last keys, a power of two */
#define KS_MAX_THREADS 4096
#define KS_THREAD_SLOTS 8192 /* a power of two */
#define KS_MAX_PIDS 4096     /* processes followed below target_tgid (-- CMD) */

/* ks_key.flags */
#define KS_F_KERNEL_EXIT 1u   /* a kvm_exit -> kvm_entry exit (exit_reason/isa are valid) */
#define KS_F_USERSPACE 2u     /* reached the VMM (user_reason/user_err are valid) */
#define KS_F_KERNEL_ACCESS 4u /* an access handled in the kernel with no exit record */
#define KS_F_NOT_TRACED 8u    /* no end record: counted, never timed */

/* ks_key.subkind: SubKeyKind of event.h */
#define KS_SUB_NONE 0
#define KS_SUB_PORT 1
#define KS_SUB_MMIO 2
#define KS_SUB_MSR 3
#define KS_SUB_HYPERCALL 4

/* ks_key.dir: Direction of event.h */
#define KS_DIR_NONE 0
#define KS_DIR_READ 1
#define KS_DIR_WRITE 2

/* What identifies one row of samples. Every field is set (zero when unused). */
struct ks_key {
  __u32 tgid;        /* the VMM process */
  __u32 tid;         /* the vCPU thread */
  __s32 vcpu;        /* vcpu_id of kvm_exit / kvm_entry / kvm_page_fault; -1 when none */
  __u32 exit_reason; /* kvm_exit's exit_reason (KS_F_KERNEL_EXIT) */
  __u64 aux;         /* kvm_exit's info2 for PVM HYPERCALL (the raw hypercall number) */
  __u64 subkey;      /* port, guest-physical address, MSR index or hypercall number */
  __u32 user_reason; /* KVM_EXIT_* of kvm_userspace_exit (KS_F_USERSPACE) */
  __s32 user_err;    /* its errno field (< 0: restart / error) */
  __u8 isa;          /* kvm_exit's isa: 1 VMX, 2 SVM, 3 PVM; 0 for userspace-only exits */
  __u8 flags;        /* KS_F_* */
  __u8 subkind;      /* KS_SUB_* */
  __u8 dir;          /* KS_DIR_* */
  __u8 size;         /* access size in bytes */
  __u8 pad[3];
};

struct ks_stats {
  __u64 timed;   /* samples with a duration */
  __u64 untimed; /* samples without one (KS_F_NOT_TRACED) */
  __u64 sum;     /* of durations, ns */
  __u64 min, max;
  __u64 sq_lo, sq_hi; /* sum of squared durations, 128 bits */
};

struct ks_slot {
  struct ks_key key; /* flags == 0: not written yet */
  struct ks_stats stats;
  __u32 row[KS_KEY_ROWS]; /* 1 + the ks_rows entry of buckets [64 r, 64 r + 64); 0: none yet */
  __u32 pad;
};

struct ks_row {
  __u64 n[KS_ROW_BUCKETS];
};

struct ks_alloc {
  __u32 slots; /* ks_slots entries handed out (may pass KS_MAX_KEYS: then full) */
  __u32 rows;  /* ks_rows entries handed out (may pass KS_MAX_ROWS: then full) */
};

/* One access seen in a run window, or a kernel exit's child. */
struct ks_access {
  __u64 key;
  __u8 kind; /* KS_SUB_*; KS_SUB_NONE: no access */
  __u8 dir;
  __u8 size;
  __u8 unsatisfied; /* kvm_mmio unsatisfied-read */
  __u8 pad[4];
};

/* ks_thread.phase */
#define KS_IDLE 0
#define KS_KERNEL_EXIT 1 /* after kvm_exit */
#define KS_USER_EXIT 2   /* after kvm_userspace_exit (no kvm_exit on this host) */

/* ks_thread.hold_next / held: what a finished userspace exit waits for in the next window */
#define KS_HOLD_NONE 0
#define KS_HOLD_PIO_READ 1
#define KS_HOLD_PIO_MAYBE 2
#define KS_HOLD_MMIO_READ 3

/* The tracepoints read, in the order of ks_counters.records. */
#define KS_EV_EXIT 0
#define KS_EV_ENTRY 1
#define KS_EV_USERSPACE_EXIT 2
#define KS_EV_FPU 3
#define KS_EV_PIO 4
#define KS_EV_MMIO 5
#define KS_EV_MSR 6
#define KS_EV_HYPERCALL 7
#define KS_EV_EMULATE_INSN 8
#define KS_EV_VCPU_MATCH_MMIO 9
#define KS_EV_PAGE_FAULT 10
#define KS_EV_INJ_EXCEPTION 11
#define KS_EV_CPUID 12
#define KS_EV_COUNT 13

/* The pairing state of one thread: sources/kvm_pairing.h's KvmPairer::Thread, in the kernel.
 * What every hit reads and writes comes first (the kvm-run pairing touches only the first
 * three cache lines: each cold line a program touches costs here). */
struct ks_thread {
  __u32 tgid;
  __u32 tid;
  __s32 vcpu;
  __u8 phase;
  __u8 seen_entry;   /* a kvm_entry came on this thread: kernel exits have ends */
  __u8 window_fresh; /* no kvm_emulate_insn and no access since the last re-entry */
  __u8 insn_dir;     /* IN / OUT of the window's last kvm_emulate_insn */
  __u64 first_ts;    /* bpf_ktime_get_ns() of the thread's first record */
  __u64 exit_ts;     /* start of the exit in flight (phase != KS_IDLE), CLOCK_MONOTONIC ns */
  /* kvm-run pairing: the thread's vCPU as last found (its preempt notifier, kvm_run) */
  __u64 vcpu_notifier;
  __u64 vcpu_run;
  __u8 hold_next;
  __u8 held;
  __u8 ev_is_kernel;
  __u8 run_loaded; /* kvm-run pairing: vcpu_run is the vCPU this thread's KVM_RUN loaded */
  __u8 pad[4];
  struct ks_key ev;               /* the exit being built */
  __u64 records[KS_EV_COUNT];     /* tracepoint hits of this thread (ks_counters: the others) */
  __u64 cache_fp[KS_KEY_CACHE];   /* fingerprints of the thread's last keys (0: none) */
  __u32 cache_slot[KS_KEY_CACHE]; /* and their ks_slots entries */
  struct ks_key held_ev;          /* a finished exit waiting for its completion (held != 0) */
  __u64 held_dur;
  struct ks_access child;     /* kernel exits: the most informative child so far */
  struct ks_access cand_pio;  /* the window's last pio_write */
  struct ks_access cand_mmio; /* the window's last mmio write or unsatisfied-read */
  struct ks_access cand_hc;   /* the window's last kvm_hypercall */
  struct ks_access candidate; /* the pio_write of a KS_HOLD_PIO_MAYBE exit */
};

struct ks_counters {
  __u64 records[KS_EV_COUNT]; /* hits of threads not tracked (maps full); Read() adds theirs */
  __u64 completions;          /* read completions attached to their exit after re-entry */
  __u64 unpaired_exits;       /* an exit overwritten by another before its end */
  __u64 entries_without_exit;
  __u64 children_outside_exit; /* candidates dropped when a kvm_exit started (as kvm_pairing) */
  __u64 keys_full;             /* samples lost: ks_slots full */
  __u64 buckets_full;          /* histogram counts lost: ks_rows full (the sample is counted) */
  __u64 threads_full;          /* records lost: ks_threads full; forks not followed: ks_pids full */
  __u64 no_vcpu; /* kvm-run pairing: exits whose vCPU was not found (counted, no access) */
};

/* Field ids: where each tracepoint field the program reads sits in its record, read by the
 * loader from the tracepoint's format file and written into the program's read-only config
 * before load (so one object runs on every kernel whatever the layout). */
#define KS_F_EXIT_REASON 0
#define KS_F_EXIT_ISA 1
#define KS_F_EXIT_INFO1 2
#define KS_F_EXIT_INFO2 3
#define KS_F_EXIT_VCPU 4
#define KS_F_ENTRY_VCPU 5
#define KS_F_UEXIT_REASON 6
#define KS_F_UEXIT_ERRNO 7
#define KS_F_FPU_LOAD 8
#define KS_F_PIO_RW 9
#define KS_F_PIO_PORT 10
#define KS_F_PIO_SIZE 11
#define KS_F_MMIO_TYPE 12
#define KS_F_MMIO_LEN 13
#define KS_F_MMIO_GPA 14
#define KS_F_MSR_WRITE 15
#define KS_F_MSR_ECX 16
#define KS_F_HC_NR 17
#define KS_F_INSN_LEN 18
#define KS_F_INSN 19
#define KS_F_VMM_GPA 20
#define KS_F_VMM_WRITE 21
#define KS_F_PF_VCPU 22
#define KS_F_COUNT 23

struct ks_config {
  __s16 offset[KS_F_COUNT]; /* -1: the field is not in this kernel's format */
  __u8 size[KS_F_COUNT];
  __u8 follow_children; /* also count processes target_tgid forks (ks_pids) */
  __u32 target_tgid;    /* 0: every process */
};

#endif /* EXITSCOPE_SOURCES_BPF_KVM_STAT_ABI_H_ */
