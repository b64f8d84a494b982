// SPDX-License-Identifier: GPL-2.0
/* sources/bpf/kvm_stat.bpf.c: `exitscope kvm stat --bpf` in the kernel.
 *
 * Pairs KVM tracepoint hits into exits per vCPU thread and keeps, per exit key, a count,
 * sum, min, max, sum of squares and a log-linear histogram with the buckets of
 * base/histogram.h: nothing is streamed to userspace, memory is fixed by the map sizes.
 *
 * The pairing is sources/kvm_pairing.cc's KvmPairer, state machine for state machine, and it
 * lives in kvm_pair_sm.h (included below, after the two hooks it calls: ks_sm_counters and
 * ks_sm_add_sample), which a userspace test compiles too and checks against KvmPairer on
 * every committed trace-cmd .dat (tests/sources/bpf_kvm_pair_sm_test.cc). This file holds
 * the maps, the decoding of each tracepoint's fields into a struct ks_rec, and the programs.
 *
 * Field offsets come from the tracepoints' format files (the loader writes them into `cfg`
 * before load; the verifier sees them as constants), so one object runs on any kernel layout
 * and both raw-tracepoint prototypes of kvm_exit (with and without exit_reason) are moot:
 * classic tracepoints carry the same fields on both.
 */
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "kvm_stat_abi.h"
#include "kvm_stat_hist.h"

char LICENSE[] SEC("license") = "GPL";

const volatile struct ks_config cfg = {};

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, KS_MAX_KEYS);
  __type(key, struct ks_key);
  __type(value, __u32);
} ks_key_index SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(map_flags, BPF_F_MMAPABLE);
  __uint(max_entries, KS_MAX_KEYS);
  __type(key, __u32);
  __type(value, struct ks_slot);
} ks_slots SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(map_flags, BPF_F_MMAPABLE);
  __uint(max_entries, KS_MAX_ROWS);
  __type(key, __u32);
  __type(value, struct ks_row);
} ks_rows SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ks_alloc);
} ks_alloc SEC(".maps");

/* Thread state: slot tid % KS_THREAD_SLOTS of an array, claimed by the first thread that
 * maps to it (an array element is one address computed in the program; a hash lookup is
 * three dependent cold reads, ~2x the cost per hit on these hosts), and a hash for the
 * threads whose slot another thread holds. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(map_flags, BPF_F_MMAPABLE);
  __uint(max_entries, KS_THREAD_SLOTS);
  __type(key, __u32);
  __type(value, struct ks_thread);
} ks_thread_slots SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, KS_MAX_THREADS);
  __type(key, __u32);
  __type(value, struct ks_thread);
} ks_threads SEC(".maps");

/* The processes counted besides target_tgid when cfg.follow_children: every process forked,
 * directly or not, by target_tgid after the program was attached (`-- CMD` run through a
 * wrapper or a shell). Fed by ks_fork; entries stay until the program is unloaded. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, KS_MAX_PIDS);
  __type(key, __u32);
  __type(value, __u8);
} ks_pids SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ks_counters);
} ks_counters SEC(".maps");

/* Initial values of new map entries (the stack is too small for a ks_thread). */
static const struct ks_thread zero_thread;

/* The hooks of kvm_pair_sm.h: the per-CPU counters and one sample of a key. */
static __always_inline struct ks_counters* ks_sm_counters(void) {
  __u32 zero = 0;
  return bpf_map_lookup_elem(&ks_counters, &zero);
}

/* Field `f` of the record at ctx, as the format file places it; 0 when absent. `f` is a
 * constant at every call, so offset and size are constants to the verifier. */
static __always_inline __u64 field(void* ctx, int f) {
  const int off = cfg.offset[f];
  if (off < 0) return 0;
  switch (cfg.size[f]) {
    case 1: {
      __u8 v = 0;
      bpf_probe_read_kernel(&v, 1, (char*)ctx + off);
      return v;
    }
    case 2: {
      __u16 v = 0;
      bpf_probe_read_kernel(&v, 2, (char*)ctx + off);
      return v;
    }
    case 4: {
      __u32 v = 0;
      bpf_probe_read_kernel(&v, 4, (char*)ctx + off);
      return v;
    }
    default: {
      __u64 v = 0;
      bpf_probe_read_kernel(&v, 8, (char*)ctx + off);
      return v;
    }
  }
}

/* A fingerprint of a key (never 0) for the thread's key cache. */
static __always_inline __u64 key_fp(const struct ks_key* k) {
  const __u64* w = (const __u64*)k;
  __u64 h = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < (int)(sizeof(*k) / 8); i++) h = (h ^ w[i]) * 0xff51afd7ed558ccdull;
  return h | 1;
}

static __always_inline int key_eq(const struct ks_key* a, const struct ks_key* b) {
  const __u64 *x = (const __u64*)a, *y = (const __u64*)b;
  for (int i = 0; i < (int)(sizeof(*a) / 8); i++)
    if (x[i] != y[i]) return 0;
  return 1;
}

/* The slot of key k: from the thread's cache, else the index (a new key gets the next free
 * slot); NULL when every slot is taken. */
static __always_inline struct ks_slot* slot_of(struct ks_thread* t, const struct ks_key* k) {
  const __u64 fp = key_fp(k);
  const __u32 ci = fp & (KS_KEY_CACHE - 1);
  struct ks_slot* s;
  if (t->cache_fp[ci] == fp) {
    __u32 i = t->cache_slot[ci];
    s = bpf_map_lookup_elem(&ks_slots, &i);
    if (s && key_eq(&s->key, k)) return s;
  }
  __u32* idx = bpf_map_lookup_elem(&ks_key_index, k);
  __u32 i;
  if (idx) {
    i = *idx;
  } else {
    __u32 zero = 0;
    struct ks_alloc* a = bpf_map_lookup_elem(&ks_alloc, &zero);
    if (!a) return 0;
    i = __sync_fetch_and_add(&a->slots, 1);
    if (i >= KS_MAX_KEYS) return 0;
    s = bpf_map_lookup_elem(&ks_slots, &i);
    if (!s) return 0;
    s->key = *k; /* before the index entry: a reader skips slots whose key is not written */
    if (bpf_map_update_elem(&ks_key_index, k, &i, BPF_NOEXIST) != 0) return 0;
  }
  s = bpf_map_lookup_elem(&ks_slots, &i);
  if (!s) return 0;
  t->cache_fp[ci] = fp;
  t->cache_slot[ci] = i;
  return s;
}

/* Adds one sample of key k (duration d when timed). */
static __noinline void ks_sm_add_sample(struct ks_thread* t, const struct ks_key* kin, __u64 d,
                                        int timed) {
  struct ks_key k = *kin;
  k.tgid = t->tgid;
  k.tid = t->tid;
  k.vcpu = t->vcpu;
  k.pad[0] = k.pad[1] = k.pad[2] = 0;
  struct ks_slot* s = slot_of(t, &k);
  if (!s) {
    struct ks_counters* c = ks_sm_counters();
    if (c) c->keys_full++;
    return;
  }
  if (!timed) {
    s->stats.untimed++;
    return;
  }
  /* The bucket first, then the totals (a reader may see a key's bucket one sample ahead). */
  const __u32 b = ks_bucket_of(d);
  const __u32 r = b / KS_ROW_BUCKETS;
  if (r < KS_KEY_ROWS) {
    __u32 ri = s->row[r];
    if (ri == 0) {
      __u32 zero = 0;
      struct ks_alloc* a = bpf_map_lookup_elem(&ks_alloc, &zero);
      __u32 n = a ? __sync_fetch_and_add(&a->rows, 1) : KS_MAX_ROWS;
      if (n < KS_MAX_ROWS) {
        ri = n + 1;
        s->row[r] = ri;
      }
    }
    __u32 row_index = ri - 1;
    struct ks_row* row = ri ? bpf_map_lookup_elem(&ks_rows, &row_index) : 0;
    if (row) {
      row->n[b % KS_ROW_BUCKETS]++;
    } else {
      struct ks_counters* c = ks_sm_counters();
      if (c) c->buckets_full++;
    }
  }
  struct ks_stats* st = &s->stats;
  st->timed++;
  st->sum += d;
  if (st->timed == 1 || d < st->min) st->min = d;
  if (d > st->max) st->max = d;
  /* d * d in 128 bits */
  const __u64 hi = d >> 32, lo = d & 0xffffffffull;
  const __u64 ll = lo * lo, hl = hi * lo, hh = hi * hi;
  __u64 sq_lo = ll + (hl << 33);
  __u64 sq_hi = hh + (hl >> 31) + (sq_lo < ll ? 1 : 0);
  const __u64 old = st->sq_lo;
  st->sq_lo = old + sq_lo;
  st->sq_hi += sq_hi + (st->sq_lo < old ? 1 : 0);
}

#include "kvm_pair_sm.h"

static __always_inline __u32 insn_dir(void* ctx) {
  const int off = cfg.offset[KS_F_INSN];
  if (off < 0) return KS_DIR_NONE;
  __u8 insn[16] = {};
  bpf_probe_read_kernel(insn, 15, (char*)ctx + off);
  return ks_sm_insn_dir_of(insn, (__u32)field(ctx, KS_F_INSN_LEN));
}

/* Whether process tgid is counted: every process, target_tgid, or one it forked. */
static __always_inline int counted(__u32 tgid) {
  if (!cfg.target_tgid || tgid == cfg.target_tgid) return 1;
  if (!cfg.follow_children) return 0;
  return bpf_map_lookup_elem(&ks_pids, &tgid) != 0;
}

/* A fork by a counted process: the child process is counted too (a new thread of a counted
 * process already is). raw_tp: the arguments, read through CO-RE; not on any exit's path. */
SEC("raw_tp/sched_process_fork")
int BPF_PROG(ks_fork, struct task_struct* parent, struct task_struct* child) {
  const __u32 ptgid = bpf_get_current_pid_tgid() >> 32;
  if (!cfg.follow_children || !counted(ptgid)) return 0;
  __u32 ctgid = BPF_CORE_READ(child, tgid);
  if (ctgid == ptgid) return 0;
  __u8 one = 1;
  if (bpf_map_update_elem(&ks_pids, &ctgid, &one, BPF_ANY) != 0) {
    struct ks_counters* c = ks_sm_counters();
    if (c) c->threads_full++;
  }
  return 0;
}

/* Common entry: the process filter and the thread's state; NULL when not counted. */
static __always_inline struct ks_thread* thread_of(__u32 type, __u32* tid_out) {
  const __u64 pid_tgid = bpf_get_current_pid_tgid();
  const __u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
  if (!counted(tgid)) return 0;
  __u32 slot = tid & (KS_THREAD_SLOTS - 1);
  struct ks_thread* t = bpf_map_lookup_elem(&ks_thread_slots, &slot);
  if (t && t->tid != tid && (t->tid != 0 || __sync_val_compare_and_swap(&t->tid, 0, tid) != 0))
    t = bpf_map_lookup_elem(&ks_threads, &tid); /* the slot is another thread's */
  if (!t) {
    bpf_map_update_elem(&ks_threads, &tid, &zero_thread, BPF_NOEXIST);
    t = bpf_map_lookup_elem(&ks_threads, &tid);
    if (!t) {
      struct ks_counters* c = ks_sm_counters();
      if (c) {
        if (type < KS_EV_COUNT) c->records[type]++;
        c->threads_full++;
      }
      return 0;
    }
  }
  /* Counted in the thread's own entry, which every hit touches anyway (a per-CPU counter
   * would be one more cold page per hit). */
  if (type < KS_EV_COUNT) t->records[type]++;
  if (t->first_ts == 0) KS_SM_THREAD_START(t, tid, bpf_ktime_get_ns()); /* new thread */
  t->tgid = tgid;
  *tid_out = tid;
  return t;
}

/* Common exit: the decoded record fed to the thread's pairing. */
static __always_inline int finish(struct ks_thread* t, struct ks_rec* r, __u32 type, __u32 tid) {
  r->ts = bpf_ktime_get_ns();
  r->type = type;
  return ks_sm_record(t, r, tid);
}

/* Classic tracepoints: the fields of the trace record, where the format file puts them. */
static __always_inline int handle(void* ctx, __u32 type) {
  __u32 tid = 0;
  struct ks_thread* t = thread_of(type, &tid);
  if (!t) return 0;
  struct ks_rec r = {};
  r.vcpu_id = -1;
  switch (type) {
    case KS_EV_EXIT:
      r.exit_reason = (__u32)field(ctx, KS_F_EXIT_REASON);
      r.isa = (__u32)field(ctx, KS_F_EXIT_ISA);
      r.info1 = field(ctx, KS_F_EXIT_INFO1);
      r.info2 = field(ctx, KS_F_EXIT_INFO2);
      if (cfg.offset[KS_F_EXIT_VCPU] >= 0) r.vcpu_id = (__s32)field(ctx, KS_F_EXIT_VCPU);
      break;
    case KS_EV_ENTRY:
      if (cfg.offset[KS_F_ENTRY_VCPU] >= 0) r.vcpu_id = (__s32)field(ctx, KS_F_ENTRY_VCPU);
      break;
    case KS_EV_USERSPACE_EXIT:
      r.reason = (__u32)field(ctx, KS_F_UEXIT_REASON);
      r.err = (__s32)field(ctx, KS_F_UEXIT_ERRNO);
      break;
    case KS_EV_FPU:
      r.write = (__u32)field(ctx, KS_F_FPU_LOAD);
      break;
    case KS_EV_PIO:
      r.write = (__u32)field(ctx, KS_F_PIO_RW);
      r.addr = field(ctx, KS_F_PIO_PORT);
      r.size = (__u32)field(ctx, KS_F_PIO_SIZE);
      break;
    case KS_EV_MMIO:
      r.mmio_type = (__u32)field(ctx, KS_F_MMIO_TYPE);
      r.size = (__u32)field(ctx, KS_F_MMIO_LEN);
      r.addr = field(ctx, KS_F_MMIO_GPA);
      r.write = r.mmio_type == KS_MMIO_WRITE;
      break;
    case KS_EV_MSR:
      r.write = (__u32)field(ctx, KS_F_MSR_WRITE);
      r.addr = (__u32)field(ctx, KS_F_MSR_ECX);
      break;
    case KS_EV_HYPERCALL:
      r.addr = field(ctx, KS_F_HC_NR);
      break;
    case KS_EV_EMULATE_INSN:
      r.insn_dir = insn_dir(ctx);
      break;
    case KS_EV_VCPU_MATCH_MMIO:
      r.addr = field(ctx, KS_F_VMM_GPA);
      r.write = (__u32)field(ctx, KS_F_VMM_WRITE);
      break;
    case KS_EV_PAGE_FAULT:
      if (cfg.offset[KS_F_PF_VCPU] >= 0) r.vcpu_id = (__s32)field(ctx, KS_F_PF_VCPU);
      break;
    default:
      break;
  }
  return finish(t, &r, type, tid);
}

SEC("tracepoint/kvm/kvm_exit")
int ks_kvm_exit(void* ctx) {
  return handle(ctx, KS_EV_EXIT);
}
SEC("tracepoint/kvm/kvm_entry")
int ks_kvm_entry(void* ctx) {
  return handle(ctx, KS_EV_ENTRY);
}
SEC("tracepoint/kvm/kvm_userspace_exit")
int ks_kvm_userspace_exit(void* ctx) {
  return handle(ctx, KS_EV_USERSPACE_EXIT);
}
SEC("tracepoint/kvm/kvm_fpu")
int ks_kvm_fpu(void* ctx) {
  return handle(ctx, KS_EV_FPU);
}
SEC("tracepoint/kvm/kvm_pio")
int ks_kvm_pio(void* ctx) {
  return handle(ctx, KS_EV_PIO);
}
SEC("tracepoint/kvm/kvm_mmio")
int ks_kvm_mmio(void* ctx) {
  return handle(ctx, KS_EV_MMIO);
}
SEC("tracepoint/kvm/kvm_msr")
int ks_kvm_msr(void* ctx) {
  return handle(ctx, KS_EV_MSR);
}
SEC("tracepoint/kvm/kvm_hypercall")
int ks_kvm_hypercall(void* ctx) {
  return handle(ctx, KS_EV_HYPERCALL);
}
SEC("tracepoint/kvm/kvm_emulate_insn")
int ks_kvm_emulate_insn(void* ctx) {
  return handle(ctx, KS_EV_EMULATE_INSN);
}
SEC("tracepoint/kvm/vcpu_match_mmio")
int ks_vcpu_match_mmio(void* ctx) {
  return handle(ctx, KS_EV_VCPU_MATCH_MMIO);
}
SEC("tracepoint/kvm/kvm_page_fault")
int ks_kvm_page_fault(void* ctx) {
  return handle(ctx, KS_EV_PAGE_FAULT);
}
SEC("tracepoint/kvm/kvm_inj_exception")
int ks_kvm_inj_exception(void* ctx) {
  return handle(ctx, KS_EV_INJ_EXCEPTION);
}
SEC("tracepoint/kvm/kvm_cpuid")
int ks_kvm_cpuid(void* ctx) {
  return handle(ctx, KS_EV_CPUID);
}

/* BTF-typed raw tracepoints (tp_btf): the program gets the tracepoint's own arguments, so the
 * kernel builds no trace record and the program reads no format-file offsets. Prototypes of
 * Linux 6.x (the loader checks each one against the kernel's BTF before choosing these):
 *   kvm_entry(vcpu, force_immediate_exit)   kvm_userspace_exit(reason, errno)
 *   kvm_fpu(load)                           kvm_pio(rw, port, size, count, data)
 *   kvm_mmio(type, len, gpa, val)           kvm_msr(write, ecx, data, exception)
 *   kvm_hypercall(nr, a0, a1, a2, a3)       kvm_emulate_insn(vcpu, failed)
 *   vcpu_match_mmio(gva, gpa, write, gpa_match)
 *   kvm_inj_exception(...), kvm_cpuid(...)  (no argument read)
 * kvm_exit and kvm_page_fault stay classic tracepoints: kvm_exit's exit reason, info1 and
 * info2 are computed inside the tracepoint (the vendor's get_exit_info static call) and its
 * raw prototype differs across kernels ((exit_reason, vcpu, isa) before 5.16, (vcpu, isa)
 * since); kvm_page_fault's too ((addr, error_code), later (vcpu, addr, error_code)). */
#define KS_BTF_PROG(name, type, ...)             \
  SEC("tp_btf/" #name)                           \
  int BPF_PROG(ks_btf_##name, ##__VA_ARGS__) {   \
    __u32 tid = 0;                               \
    struct ks_thread* t = thread_of(type, &tid); \
    if (!t) return 0;                            \
    struct ks_rec r = {};                        \
    r.vcpu_id = -1;

#define KS_BTF_END(type)           \
  return finish(t, &r, type, tid); \
  }

KS_BTF_PROG(kvm_entry, KS_EV_ENTRY, struct kvm_vcpu* vcpu)
r.vcpu_id = vcpu->vcpu_id;
KS_BTF_END(KS_EV_ENTRY)

KS_BTF_PROG(kvm_userspace_exit, KS_EV_USERSPACE_EXIT, __u32 reason, int errno_)
r.reason = reason;
r.err = errno_;
KS_BTF_END(KS_EV_USERSPACE_EXIT)

KS_BTF_PROG(kvm_fpu, KS_EV_FPU, int load)
r.write = load != 0;
KS_BTF_END(KS_EV_FPU)

KS_BTF_PROG(kvm_pio, KS_EV_PIO, unsigned int rw, unsigned int port, unsigned int size)
r.write = rw;
r.addr = port;
r.size = size;
KS_BTF_END(KS_EV_PIO)

KS_BTF_PROG(kvm_mmio, KS_EV_MMIO, int type, int len, __u64 gpa)
r.mmio_type = (__u32)type;
r.size = (__u32)len;
r.addr = gpa;
r.write = type == KS_MMIO_WRITE;
KS_BTF_END(KS_EV_MMIO)

KS_BTF_PROG(kvm_msr, KS_EV_MSR, unsigned int write, __u32 ecx)
r.write = write;
r.addr = ecx;
KS_BTF_END(KS_EV_MSR)

KS_BTF_PROG(kvm_hypercall, KS_EV_HYPERCALL, unsigned long nr)
r.addr = nr;
KS_BTF_END(KS_EV_HYPERCALL)

KS_BTF_PROG(kvm_emulate_insn, KS_EV_EMULATE_INSN, struct kvm_vcpu* vcpu) {
  /* What the tracepoint copies: the emulator's fetch cache. */
  struct x86_emulate_ctxt* ctxt = BPF_CORE_READ(vcpu, arch.emulate_ctxt);
  __u8 insn[16] = {};
  const __u8* data = (const __u8*)&ctxt->fetch.data[0];
  const __u8* ptr = BPF_CORE_READ(ctxt, fetch.ptr);
  bpf_probe_read_kernel(insn, 15, data);
  const __u64 n = (__u64)ptr - (__u64)data;
  r.insn_dir = ks_sm_insn_dir_of(insn, n > 15 ? 15 : (__u32)n);
}
KS_BTF_END(KS_EV_EMULATE_INSN)

KS_BTF_PROG(vcpu_match_mmio, KS_EV_VCPU_MATCH_MMIO, __u64 gva, __u64 gpa, bool write)
r.addr = gpa;
r.write = write;
KS_BTF_END(KS_EV_VCPU_MATCH_MMIO)

KS_BTF_PROG(kvm_inj_exception, KS_EV_INJ_EXCEPTION)
KS_BTF_END(KS_EV_INJ_EXCEPTION)

KS_BTF_PROG(kvm_cpuid, KS_EV_CPUID)
KS_BTF_END(KS_EV_CPUID)

/* The kvm-run pairing (the loader loads these instead of everything above on hosts where
 * kvm_exit never fires, e.g. kvm-pvm): a userspace exit is, as in the tracepoint pairing,
 * kvm_userspace_exit -> the next kvm_fpu load on the thread, but what it was is read where
 * KVM left it for the VMM, in the vCPU's struct kvm_run (exit_reason, io.port/size/direction,
 * mmio.phys_addr/len/is_write, hypercall.nr, msr.index), at kvm_userspace_exit. Three program
 * runs per exit instead of six (one of them, the kvm_fpu unload, returns at once), and no run
 * window to keep.
 * Accesses handled in the kernel are counted only where the table needs them (--event
 * ioport|mmio|msr|hypercall: ks_run_kvm_pio ...): every hit is counted as one, and userspace
 * subtracts each exit's own access (bpf_kvm_maps.cc).
 *
 * Which vCPU: KVM registers &vcpu->preempt_notifier on the task in vcpu_load() and removes
 * it in vcpu_put(); the kvm_fpu load falls in between, so there the task's first preempt
 * notifier is its vCPU's (checked: that vCPU's pid is the task's), and that KVM_RUN's
 * kvm_userspace_exit reads the kvm_run found then. */

/* The kvm_run of the thread's loaded vCPU (0: none), cached in the thread's entry: while the
 * task's first preempt notifier is the one found last time, the vCPU is the same and its
 * struct kvm_vcpu is not read again (each cold page a program touches costs here). */
static __always_inline __u64 loaded_vcpu_run(struct ks_thread* t) {
  struct task_struct* task = bpf_get_current_task_btf();
  struct hlist_node* n = task->preempt_notifiers.first;
  if (!n) return 0;
  if ((__u64)n == t->vcpu_notifier) return t->vcpu_run;
  struct kvm_vcpu* v =
      (struct kvm_vcpu*)((char*)n - bpf_core_field_offset(struct kvm_vcpu, preempt_notifier));
  if (BPF_CORE_READ(v, pid) != task->thread_pid) return 0;
  t->vcpu_notifier = (__u64)n;
  t->vcpu_run = (__u64)BPF_CORE_READ(v, run);
  t->vcpu = BPF_CORE_READ(v, vcpu_id);
  return t->vcpu_run;
}

/* kvm_fpu: the load, in KVM_RUN after vcpu_load(), ends the exit in flight and finds the
 * vCPU (its preempt notifier is registered now); the unload returns at once. That unload
 * comes in the same KVM_RUN, just before vcpu_put() and kvm_userspace_exit, which counts it
 * (every KVM_RUN that loads unloads: kvm_arch_vcpu_ioctl_run's one way out). A program that
 * returns at once is the cheapest run there is, and this tracepoint's are a third of all. */
SEC("tp_btf/kvm_fpu")
int BPF_PROG(ks_run_kvm_fpu, int load) {
  if (!load) return 0;
  __u32 tid = 0;
  struct ks_thread* t = thread_of(KS_EV_FPU, &tid);
  if (!t) return 0;
  if (ks_sm_run_exit_open(t)) ks_sm_end_exit(t, bpf_ktime_get_ns());
  t->run_loaded = loaded_vcpu_run(t) != 0;
  return 0;
}

/* kvm_userspace_exit: the exit starts; what it was is read from the kvm_run of the vCPU this
 * KVM_RUN loaded (found at its kvm_fpu load: vcpu_put() has removed the notifier by now). */
SEC("tp_btf/kvm_userspace_exit")
int BPF_PROG(ks_run_kvm_userspace_exit, __u32 reason, int errno_) {
  __u32 tid = 0;
  struct ks_thread* t = thread_of(KS_EV_USERSPACE_EXIT, &tid);
  if (!t) return 0;
  const __u64 now = bpf_ktime_get_ns();
  t->records[KS_EV_FPU]++; /* this KVM_RUN's kvm_fpu unload (see ks_run_kvm_fpu) */
  const __u64 run = t->run_loaded ? t->vcpu_run : 0;
  t->run_loaded = 0;
  if (!run) { /* counted all the same, by its reason alone */
    struct ks_counters* c = ks_sm_counters();
    if (c) c->no_vcpu++;
  }
  ks_sm_run_exit_begin(t, tid);
  struct ks_kvm_run_head h = {};
  if (run) bpf_probe_read_kernel(&h, sizeof h, (const void*)run); /* one read, one line */
  ks_sm_run_exit(t, &h, now, reason, errno_);
  return 0;
}

/* One access hit, counted as handled in the kernel (userspace subtracts the exits' own). */
static __always_inline int run_access(__u32 type, __u8 kind, __u64 key, __u8 dir, __u8 size) {
  __u32 tid = 0;
  struct ks_thread* t = thread_of(type, &tid);
  if (!t) return 0;
  struct ks_access a = {};
  ks_sm_set_access(&a, kind, key, dir, size, 0);
  ks_sm_emit_access(t, &a);
  return 0;
}

SEC("tp_btf/kvm_pio")
int BPF_PROG(ks_run_kvm_pio, unsigned int rw, unsigned int port, unsigned int size) {
  return run_access(KS_EV_PIO, KS_SUB_PORT, port, rw ? KS_DIR_WRITE : KS_DIR_READ, size);
}

SEC("tp_btf/kvm_mmio")
int BPF_PROG(ks_run_kvm_mmio, int type, int len, __u64 gpa) {
  if (type == KS_MMIO_UNSATISFIED_READ) { /* a read going to the VMM: its completion counts */
    __u32 tid = 0;
    thread_of(KS_EV_MMIO, &tid);
    return 0;
  }
  return run_access(KS_EV_MMIO, KS_SUB_MMIO, gpa,
                    type == KS_MMIO_WRITE ? KS_DIR_WRITE : KS_DIR_READ, (__u8)len);
}

SEC("tp_btf/kvm_msr")
int BPF_PROG(ks_run_kvm_msr, unsigned int write, __u32 ecx) {
  return run_access(KS_EV_MSR, KS_SUB_MSR, ecx, write ? KS_DIR_WRITE : KS_DIR_READ, 8);
}

SEC("tp_btf/kvm_hypercall")
int BPF_PROG(ks_run_kvm_hypercall, unsigned long nr) {
  return run_access(KS_EV_HYPERCALL, KS_SUB_HYPERCALL, nr, KS_DIR_NONE, 0);
}
