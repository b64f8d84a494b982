/* sources/bpf/kvm_pair_sm.h: the pairing state machine of `kvm stat --bpf`, one vCPU thread at
 * a time, in plain C. It is compiled into the BPF program (kvm_stat.bpf.c, clang -target
 * bpf) and into a userspace harness (tests/sources/bpf_kvm_pair_sm_test.cc, g++, no root),
 * which feeds it every committed trace-cmd .dat and checks what it counts against KvmPairer
 * (sources/kvm_pairing.h, whose header gives the kernel's emit order these rules follow).
 *
 * Two pairings (docs/kvm-bpf.md "Two pairings"):
 *   - tracepoints: ks_sm_record() per kvm tracepoint hit, decoded into a struct ks_rec.
 *     kvm_exit -> the next kvm_entry (children in between give the sub-key); where kvm_exit
 *     never fires, kvm_userspace_exit -> the next kvm_fpu load, the run window's last
 *     pio_write / mmio write or unsatisfied-read / kvm_hypercall being the exit's own access,
 *     a read's completion coming first in the next window, every other access counted as
 *     handled in the kernel. KvmPairer state for state, but for one thing: the window is not
 *     kept whole. Accesses that can never be an exit's own (reads, MSRs) are counted as
 *     handled in the kernel when they come, and only the last candidate of each kind is kept.
 *   - kvm-run: ks_sm_run_exit_begin() + ks_sm_run_exit() at kvm_userspace_exit (what the exit
 *     was: the vCPU's struct kvm_run, read by the caller), ended by ks_sm_end_exit() at the
 *     next kvm_fpu load when ks_sm_run_exit_open().
 *
 * What comes out: ks_sm_add_sample(t, key, duration, timed) per exit or access (the caller
 * aggregates per key), and the counters of struct ks_counters. An ended userspace exit that
 * waits for its read's completion stays in the thread (held / held_ev / held_dur) until the
 * next window says; an exit in flight is phase != KS_IDLE since exit_ts. Durations are
 * differences of the ts the caller feeds (the program: bpf_ktime_get_ns()).
 *
 * No libc, no loops but bounded ones, no allocation; every function is inlined (KS_SM_INLINE)
 * but ks_sm_feed (KS_SM_NOINLINE: one BPF-to-BPF call per record, as the program always had).
 *
 * Before including it, the includer provides the fixed-width types (__u8 .. __u64, __s32:
 * vmlinux.h or <linux/types.h>), kvm_stat_abi.h, and two functions:
 *   struct ks_counters* ks_sm_counters(void);   the counters to add to (NULL: none)
 *   void ks_sm_add_sample(struct ks_thread* t, const struct ks_key* k, __u64 d, int timed);
 *       one sample of key k (its tgid / tid / vcpu are the thread's: the callee sets them),
 *       of duration d when timed, else without time (KS_F_NOT_TRACED keys, accesses)
 */
#ifndef EXITSCOPE_SOURCES_BPF_KVM_PAIR_SM_H_
#define EXITSCOPE_SOURCES_BPF_KVM_PAIR_SM_H_

#include "kvm_stat_abi.h"

#ifndef KS_SM_INLINE
#define KS_SM_INLINE static inline __attribute__((always_inline))
#endif
#ifndef KS_SM_NOINLINE
#define KS_SM_NOINLINE static __attribute__((noinline))
#endif
/* An all-zero initializer: `{0}` in ISO C11, `{}` in C++ (where `{0}` draws
 * -Wmissing-field-initializers). */
/* clang-format off */
#ifdef __cplusplus
#define KS_SM_ZERO {}
#else
#define KS_SM_ZERO {0}
#endif
/* clang-format on */
/* Keeps the stores on either side in program order (the in-flight view reads them). */
#define KS_SM_BARRIER() __asm__ __volatile__("" ::: "memory")

/* kvm_mmio's type field */
#define KS_MMIO_UNSATISFIED_READ 0
#define KS_MMIO_READ 1
#define KS_MMIO_WRITE 2

/* KVM_EXIT_* of kvm_userspace_exit and struct kvm_run (include/uapi/linux/kvm.h) */
#define KS_KVM_EXIT_IO 2
#define KS_KVM_EXIT_HYPERCALL 3
#define KS_KVM_EXIT_MMIO 6
#define KS_KVM_EXIT_X86_RDMSR 29
#define KS_KVM_EXIT_X86_WRMSR 30
#define KS_KVM_EXIT_IO_IN 0 /* kvm_run io.direction */

/* One decoded tracepoint hit (only what `type` defines is set; vcpu_id -1 when none). */
struct ks_rec {
  __u64 ts;
  __u64 addr;
  __u64 info1, info2;
  __u32 type; /* KS_EV_* */
  __u32 write;
  __u32 size;
  __u32 mmio_type;
  __u32 exit_reason, isa;
  __u32 reason;
  __s32 err;
  __s32 vcpu_id;
  __u32 insn_dir;
};

/* A thread's first record: its entry is all zeros but for these. A statement macro, not a
 * function: inlined as a function, clang schedules the program's stores differently. */
#define KS_SM_THREAD_START(t, tid_, first_ts_) \
  do {                                         \
    (t)->first_ts = (first_ts_);               \
    (t)->tid = (tid_);                         \
    (t)->vcpu = -1;                            \
    (t)->window_fresh = 1;                     \
  } while (0)

/* An access handled in the kernel (no exit record of its own): counted, no time. */
KS_SM_INLINE void ks_sm_emit_access(struct ks_thread* t, const struct ks_access* a) {
  struct ks_key k = KS_SM_ZERO;
  k.flags = KS_F_KERNEL_ACCESS | KS_F_NOT_TRACED;
  k.subkind = a->kind;
  k.subkey = a->key;
  k.dir = a->dir;
  k.size = a->size;
  ks_sm_add_sample(t, &k, 0, 0);
}

/* Counts the window's candidates as handled in the kernel, but the exit's own (KS_OWN_*). */
#define KS_OWN_NONE 0
#define KS_OWN_PIO 1
#define KS_OWN_MMIO 2
#define KS_OWN_HC 3
KS_SM_INLINE void ks_sm_emit_candidates(struct ks_thread* t, int own) {
  if (t->cand_pio.kind && own != KS_OWN_PIO) ks_sm_emit_access(t, &t->cand_pio);
  if (t->cand_mmio.kind && own != KS_OWN_MMIO) ks_sm_emit_access(t, &t->cand_mmio);
  if (t->cand_hc.kind && own != KS_OWN_HC) ks_sm_emit_access(t, &t->cand_hc);
  t->cand_pio.kind = t->cand_mmio.kind = t->cand_hc.kind = 0;
}

KS_SM_INLINE void ks_sm_clear_window(struct ks_thread* t) {
  struct ks_counters* c = ks_sm_counters();
  __u64 n = (t->cand_pio.kind != 0) + (t->cand_mmio.kind != 0) + (t->cand_hc.kind != 0);
  if (c) c->children_outside_exit += n;
  t->cand_pio.kind = t->cand_mmio.kind = t->cand_hc.kind = 0;
  t->child.kind = 0;
}

KS_SM_INLINE void ks_sm_set_access(struct ks_access* a, __u8 kind, __u64 key, __u8 dir, __u8 size,
                                   __u8 unsat) {
  a->kind = kind;
  a->key = key;
  a->dir = dir;
  a->size = size;
  a->unsatisfied = unsat;
}

/* KvmPairer::AddChild (kernel exits). */
KS_SM_INLINE void ks_sm_add_child(struct ks_thread* t, const struct ks_rec* r) {
  struct ks_access* c = &t->child;
  switch (r->type) {
    case KS_EV_PIO:
      if (!r->write && c->kind == KS_SUB_PORT && c->key == r->addr && c->dir == KS_DIR_READ)
        break; /* completion of an IN handled before kvm_entry */
      ks_sm_set_access(c, KS_SUB_PORT, r->addr, r->write ? KS_DIR_WRITE : KS_DIR_READ, r->size, 0);
      break;
    case KS_EV_MMIO:
      if (r->mmio_type == KS_MMIO_READ && c->kind == KS_SUB_MMIO && c->key == r->addr) break;
      ks_sm_set_access(c, KS_SUB_MMIO, r->addr,
                       r->mmio_type == KS_MMIO_WRITE ? KS_DIR_WRITE : KS_DIR_READ, r->size, 0);
      break;
    case KS_EV_VCPU_MATCH_MMIO:
      if (c->kind == KS_SUB_NONE)
        ks_sm_set_access(c, KS_SUB_MMIO, r->addr, r->write ? KS_DIR_WRITE : KS_DIR_READ, 0, 0);
      break;
    case KS_EV_MSR:
      ks_sm_set_access(c, KS_SUB_MSR, r->addr, r->write ? KS_DIR_WRITE : KS_DIR_READ, 8, 0);
      break;
    case KS_EV_HYPERCALL:
      ks_sm_set_access(c, KS_SUB_HYPERCALL, r->addr, KS_DIR_NONE, 0, 0);
      break;
    case KS_EV_PAGE_FAULT:
      if (r->vcpu_id >= 0) t->vcpu = r->vcpu_id;
      break;
    default:
      break;
  }
}

/* KvmPairer::ApplyChild. */
KS_SM_INLINE void ks_sm_apply_child(struct ks_thread* t) {
  const struct ks_access* c = &t->child;
  if (c->kind == KS_SUB_NONE) return;
  if (t->ev.subkind == KS_SUB_HYPERCALL && c->kind == KS_SUB_HYPERCALL) return;
  t->ev.subkind = c->kind;
  t->ev.subkey = c->key;
  t->ev.size = c->size;
  t->ev.dir = c->dir;
}

KS_SM_INLINE void ks_sm_clear_ev(struct ks_key* e, __u32 tid) {
  __builtin_memset(e, 0, sizeof(*e));
  e->tid = tid;
}

KS_SM_INLINE void ks_sm_start_kernel_exit(struct ks_thread* t, const struct ks_rec* r, __u32 tid) {
  struct ks_key* e = &t->ev;
  ks_sm_clear_ev(e, tid);
  t->exit_ts = r->ts;
  t->ev_is_kernel = 1;
  t->phase = KS_KERNEL_EXIT;
  t->child.kind = 0;
  if (r->vcpu_id >= 0) t->vcpu = r->vcpu_id;
  e->isa = r->isa <= 3 ? r->isa : 0;
  e->exit_reason = r->exit_reason;
  e->flags = KS_F_KERNEL_EXIT;
  if (e->isa == 3 && r->exit_reason == 0x20000) { /* PVM HYPERCALL: raw number in info2 */
    e->aux = r->info2;
    e->subkind = KS_SUB_HYPERCALL;
    e->subkey = r->info2;
  } else if (e->isa == 1 && (r->exit_reason & 0xffff) == 30) { /* VMX IO_INSTRUCTION */
    e->subkind = KS_SUB_PORT;
    e->subkey = (r->info1 >> 16) & 0xffff;
    e->size = (r->info1 & 7) + 1;
    e->dir = (r->info1 & 8) ? KS_DIR_READ : KS_DIR_WRITE;
  } else if (e->isa == 2 && r->exit_reason == 0x7b) { /* SVM IOIO */
    e->subkind = KS_SUB_PORT;
    e->subkey = (r->info1 >> 16) & 0xffff;
    e->size = (r->info1 & 0x10) ? 1 : (r->info1 & 0x20) ? 2 : (r->info1 & 0x40) ? 4 : 0;
    e->dir = (r->info1 & 1) ? KS_DIR_READ : KS_DIR_WRITE;
  }
}

/* KvmPairer::StartUserExit: which candidate is the exit's own access. */
KS_SM_INLINE void ks_sm_start_user_exit(struct ks_thread* t, const struct ks_rec* r, __u32 tid) {
  struct ks_key* e = &t->ev;
  ks_sm_clear_ev(e, tid);
  t->exit_ts = r->ts;
  t->ev_is_kernel = 0;
  t->phase = KS_USER_EXIT;
  e->flags = KS_F_USERSPACE;
  e->user_reason = r->reason;
  e->user_err = r->err;
  t->hold_next = KS_HOLD_NONE;
  int own = KS_OWN_NONE;
  if (r->err >= 0 && r->reason == KS_KVM_EXIT_IO) {
    if (t->insn_dir == KS_DIR_READ) {
      t->hold_next = KS_HOLD_PIO_READ;
    } else if (!t->cand_pio.kind) {
      t->hold_next = KS_HOLD_PIO_READ;
    } else {
      own = KS_OWN_PIO;
      if (t->insn_dir == KS_DIR_NONE) {
        t->hold_next = KS_HOLD_PIO_MAYBE;
        t->candidate = t->cand_pio;
      }
    }
  } else if (r->err >= 0 && r->reason == KS_KVM_EXIT_MMIO) {
    if (t->cand_mmio.kind) {
      own = KS_OWN_MMIO;
      if (t->cand_mmio.unsatisfied) t->hold_next = KS_HOLD_MMIO_READ;
    }
  } else if (r->err >= 0 && r->reason == KS_KVM_EXIT_HYPERCALL) {
    if (t->cand_hc.kind) own = KS_OWN_HC;
  }
  const struct ks_access* o = own == KS_OWN_PIO    ? &t->cand_pio
                              : own == KS_OWN_MMIO ? &t->cand_mmio
                                                   : &t->cand_hc;
  if (own != KS_OWN_NONE) {
    e->subkind = o->kind;
    e->subkey = o->key;
    e->size = o->size;
    e->dir = o->dir;
  } else if (t->hold_next == KS_HOLD_PIO_READ) {
    e->dir = KS_DIR_READ;
  }
  ks_sm_emit_candidates(t, own);
  t->child.kind = 0;
}

/* KvmPairer::EndExit. */
KS_SM_INLINE void ks_sm_end_exit(struct ks_thread* t, __u64 end_ts) {
  if (t->ev_is_kernel) ks_sm_apply_child(t);
  const __u64 d = end_ts > t->exit_ts ? end_ts - t->exit_ts : 0;
  t->phase = KS_IDLE;
  t->child.kind = 0;
  if (!t->ev_is_kernel && t->hold_next != KS_HOLD_NONE) {
    t->held = t->hold_next;
    t->held_ev = t->ev;
    t->held_dur = d;
    t->hold_next = KS_HOLD_NONE;
    return;
  }
  ks_sm_add_sample(t, &t->ev, d, 1);
}

/* A kvm_exit on a thread that never showed a kvm_entry: counted, time unknown. */
KS_SM_INLINE void ks_sm_end_not_traced(struct ks_thread* t) {
  ks_sm_apply_child(t);
  t->ev.flags |= KS_F_NOT_TRACED;
  t->phase = KS_IDLE;
  t->hold_next = KS_HOLD_NONE;
  t->child.kind = 0;
  ks_sm_add_sample(t, &t->ev, 0, 0);
}

KS_SM_INLINE void ks_sm_flush_held(struct ks_thread* t) {
  if (t->held == KS_HOLD_NONE) return;
  if (t->held == KS_HOLD_PIO_MAYBE) { /* no completion came: the write was the exit's */
    t->held_ev.subkind = t->candidate.kind;
    t->held_ev.subkey = t->candidate.key;
    t->held_ev.size = t->candidate.size;
    t->held_ev.dir = t->candidate.dir;
  }
  t->held = KS_HOLD_NONE;
  ks_sm_add_sample(t, &t->held_ev, t->held_dur, 1);
}

KS_SM_INLINE int ks_sm_keeps_hold(__u32 type) {
  return type == KS_EV_FPU || type == KS_EV_VCPU_MATCH_MMIO || type == KS_EV_ENTRY;
}

/* KvmPairer::ResolveHeld: 1 when r completed the held exit (and is consumed). */
KS_SM_INLINE int ks_sm_resolve_held(struct ks_thread* t, const struct ks_rec* r) {
  struct ks_counters* c;
  if (t->held == KS_HOLD_PIO_READ || t->held == KS_HOLD_PIO_MAYBE) {
    if (r->type == KS_EV_PIO && !r->write && t->window_fresh) {
      if (t->held == KS_HOLD_PIO_MAYBE) ks_sm_emit_access(t, &t->candidate);
      t->held_ev.subkind = KS_SUB_PORT;
      t->held_ev.subkey = r->addr;
      t->held_ev.size = r->size;
      t->held_ev.dir = KS_DIR_READ;
      t->held = KS_HOLD_NONE;
      c = ks_sm_counters();
      if (c) c->completions++;
      ks_sm_add_sample(t, &t->held_ev, t->held_dur, 1);
      return 1;
    }
    if (ks_sm_keeps_hold(r->type)) return 0;
  } else if (t->held == KS_HOLD_MMIO_READ) {
    if (r->type == KS_EV_MMIO && r->mmio_type == KS_MMIO_READ && r->addr == t->held_ev.subkey) {
      t->held = KS_HOLD_NONE;
      c = ks_sm_counters();
      if (c) c->completions++;
      ks_sm_add_sample(t, &t->held_ev, t->held_dur, 1);
      return 1;
    }
    if (ks_sm_keeps_hold(r->type) || r->type == KS_EV_EMULATE_INSN) return 0;
  }
  ks_sm_flush_held(t);
  return 0;
}

/* A run window's access (no kvm_exit in flight): the last pio_write / mmio write or
 * unsatisfied-read / hypercall may be the next exit's own; anything else, and a candidate
 * replaced by a later one, was handled in the kernel. */
KS_SM_INLINE void ks_sm_add_access(struct ks_thread* t, const struct ks_rec* r) {
  struct ks_access a = KS_SM_ZERO;
  struct ks_access* slot = 0;
  switch (r->type) {
    case KS_EV_PIO:
      ks_sm_set_access(&a, KS_SUB_PORT, r->addr, r->write ? KS_DIR_WRITE : KS_DIR_READ, r->size, 0);
      if (r->write) slot = &t->cand_pio;
      break;
    case KS_EV_MMIO:
      ks_sm_set_access(&a, KS_SUB_MMIO, r->addr,
                       r->mmio_type == KS_MMIO_WRITE ? KS_DIR_WRITE : KS_DIR_READ, r->size,
                       r->mmio_type == KS_MMIO_UNSATISFIED_READ);
      if (r->mmio_type == KS_MMIO_WRITE || r->mmio_type == KS_MMIO_UNSATISFIED_READ)
        slot = &t->cand_mmio;
      break;
    case KS_EV_MSR:
      ks_sm_set_access(&a, KS_SUB_MSR, r->addr, r->write ? KS_DIR_WRITE : KS_DIR_READ, 8, 0);
      break;
    case KS_EV_HYPERCALL:
      ks_sm_set_access(&a, KS_SUB_HYPERCALL, r->addr, KS_DIR_NONE, 0, 0);
      slot = &t->cand_hc;
      break;
    default:
      return;
  }
  t->window_fresh = 0;
  if (!slot) {
    ks_sm_emit_access(t, &a);
    return;
  }
  if (slot->kind) ks_sm_emit_access(t, slot);
  *slot = a;
}

/* IN / INS -> read, OUT / OUTS -> write, else none (KvmPairer's PortInsnDirection): the
 * direction of kvm_emulate_insn's instruction bytes (ks_rec.insn_dir). */
KS_SM_INLINE __u32 ks_sm_insn_dir_of(const __u8* insn, __u32 len) {
  for (int i = 0; i < 15; i++) {
    if ((__u32)i >= len) break;
    const __u8 b = insn[i];
    if (b == 0x66 || b == 0x67 || b == 0xf2 || b == 0xf3 || b == 0xf0 || b == 0x2e || b == 0x36 ||
        b == 0x3e || b == 0x26 || b == 0x64 || b == 0x65 || (b >= 0x40 && b <= 0x4f))
      continue;
    if (b == 0xe4 || b == 0xe5 || b == 0xec || b == 0xed || b == 0x6c || b == 0x6d)
      return KS_DIR_READ;
    if (b == 0xe6 || b == 0xe7 || b == 0xee || b == 0xef || b == 0x6e || b == 0x6f)
      return KS_DIR_WRITE;
    return KS_DIR_NONE;
  }
  return KS_DIR_NONE;
}

/* KvmPairer::Feed for one thread. */
KS_SM_NOINLINE int ks_sm_feed(struct ks_thread* t, const struct ks_rec* r, __u32 tid) {
  struct ks_counters* c;
  if (t->held != KS_HOLD_NONE && ks_sm_resolve_held(t, r)) {
    t->window_fresh = 0;
    return 0;
  }
  switch (r->type) {
    case KS_EV_EXIT:
      if (t->phase == KS_KERNEL_EXIT) {
        if (t->seen_entry) {
          c = ks_sm_counters();
          if (c) c->unpaired_exits++;
        } else {
          ks_sm_end_not_traced(t);
        }
      }
      if (t->phase == KS_USER_EXIT) ks_sm_end_exit(t, r->ts);
      ks_sm_clear_window(t);
      ks_sm_start_kernel_exit(t, r, tid);
      break;
    case KS_EV_ENTRY:
      t->seen_entry = 1;
      if (t->phase != KS_IDLE) {
        ks_sm_end_exit(t, r->ts);
      } else {
        c = ks_sm_counters();
        if (c) c->entries_without_exit++;
        ks_sm_clear_window(t);
      }
      break;
    case KS_EV_USERSPACE_EXIT:
      if (t->phase == KS_KERNEL_EXIT) {
        t->ev.flags |= KS_F_USERSPACE;
        t->ev.user_reason = r->reason;
        t->ev.user_err = r->err;
        break;
      }
      if (t->phase == KS_USER_EXIT) {
        c = ks_sm_counters();
        if (c) c->unpaired_exits++;
      }
      ks_sm_start_user_exit(t, r, tid);
      break;
    case KS_EV_FPU:
      if (r->write) { /* load: KVM_RUN entered */
        if (t->phase == KS_USER_EXIT) {
          ks_sm_end_exit(t, r->ts);
        } else if (t->phase == KS_IDLE) {
          ks_sm_emit_candidates(t, KS_OWN_NONE); /* a window that ended without an exit */
          t->child.kind = 0;
        }
        if (t->phase == KS_IDLE) {
          t->window_fresh = 1;
          t->insn_dir = KS_DIR_NONE;
        }
      }
      break;
    default:
      if (t->phase == KS_KERNEL_EXIT) {
        ks_sm_add_child(t, r);
        break;
      }
      if (r->type == KS_EV_PIO || r->type == KS_EV_MMIO || r->type == KS_EV_MSR ||
          r->type == KS_EV_HYPERCALL) {
        ks_sm_add_access(t, r);
      } else if (r->type == KS_EV_EMULATE_INSN) {
        t->insn_dir = r->insn_dir;
        t->window_fresh = 0;
      } else if (r->type == KS_EV_PAGE_FAULT && r->vcpu_id >= 0) {
        t->vcpu = r->vcpu_id;
      }
      break;
  }
  return 0;
}

/* Tracepoint pairing: one record of thread t (r->ts and r->type set). */
KS_SM_INLINE int ks_sm_record(struct ks_thread* t, const struct ks_rec* r, __u32 tid) {
  if (r->vcpu_id >= 0) t->vcpu = r->vcpu_id;
  return ks_sm_feed(t, r, tid);
}

/* kvm-run pairing. The head of struct kvm_run (include/uapi/linux/kvm.h: a fixed ABI, the VMM
 * reads it), where KVM leaves what the exit is for the VMM. */
struct ks_kvm_run_head {
  __u8 request_interrupt_window, immediate_exit, padding1[6];
  __u32 exit_reason;
  __u8 ready_for_interrupt_injection, if_flag;
  __u16 flags;
  __u64 cr8, apic_base;
  union {
    struct {
      __u8 direction, size;
      __u16 port;
      __u32 count;
      __u64 data_offset;
    } io;
    struct {
      __u64 phys_addr;
      __u8 data[8];
      __u32 len;
      __u8 is_write;
    } mmio;
    struct {
      __u64 nr;
    } hypercall;
    struct {
      __u8 error, pad[7];
      __u32 reason, index;
    } msr;
  };
};

/* kvm-run pairing, at a kvm_fpu load: whether an exit is in flight that it ends (then the
 * caller reads the clock and calls ks_sm_end_exit). */
KS_SM_INLINE int ks_sm_run_exit_open(const struct ks_thread* t) {
  return t->phase == KS_USER_EXIT && t->exit_ts != 0;
}

/* kvm-run pairing, at kvm_userspace_exit(reason, errno_) at time now, in two steps around the
 * caller's read of the vCPU's kvm_run head (as the program always did it):
 *   ks_sm_run_exit_begin(t, tid);      the exit in flight, if any, is unpaired; t->ev cleared
 *   ... h = the head of kvm_run, all zeros when the vCPU was not found ...
 *   ks_sm_run_exit(t, &h, now, reason, errno_);   the exit starts
 * Userspace reads the entry meanwhile (the in-flight view): the exit is in flight only once
 * all of it is set (phase KS_IDLE in between; compiler barriers keep the stores in order, x86
 * keeps them so). */
KS_SM_INLINE void ks_sm_run_exit_begin(struct ks_thread* t, __u32 tid) {
  if (t->phase == KS_USER_EXIT) { /* two exits without a KVM_RUN load between */
    struct ks_counters* c = ks_sm_counters();
    if (c) c->unpaired_exits++;
  }
  t->phase = KS_IDLE;
  KS_SM_BARRIER();
  ks_sm_clear_ev(&t->ev, tid);
}

KS_SM_INLINE void ks_sm_run_exit(struct ks_thread* t, const struct ks_kvm_run_head* h, __u64 now,
                                 __u32 reason, __s32 errno_) {
  struct ks_key* e = &t->ev;
  const __u32 run_reason = h->exit_reason;
  e->flags = KS_F_USERSPACE;
  e->user_reason = run_reason;
  switch (run_reason) {
    case KS_KVM_EXIT_IO:
      e->subkind = KS_SUB_PORT;
      e->subkey = h->io.port;
      e->size = h->io.size;
      e->dir = h->io.direction == KS_KVM_EXIT_IO_IN ? KS_DIR_READ : KS_DIR_WRITE;
      break;
    case KS_KVM_EXIT_MMIO:
      e->subkind = KS_SUB_MMIO;
      e->subkey = h->mmio.phys_addr;
      e->size = (__u8)h->mmio.len;
      e->dir = h->mmio.is_write ? KS_DIR_WRITE : KS_DIR_READ;
      break;
    case KS_KVM_EXIT_HYPERCALL:
      e->subkind = KS_SUB_HYPERCALL;
      e->subkey = h->hypercall.nr;
      break;
    case KS_KVM_EXIT_X86_RDMSR:
    case KS_KVM_EXIT_X86_WRMSR:
      e->subkind = KS_SUB_MSR;
      e->subkey = h->msr.index;
      e->size = 8;
      e->dir = run_reason == KS_KVM_EXIT_X86_WRMSR ? KS_DIR_WRITE : KS_DIR_READ;
      break;
    default:
      break;
  }
  t->ev_is_kernel = 0;
  t->hold_next = KS_HOLD_NONE;
  t->exit_ts = now;
  e->user_reason = reason;
  e->user_err = errno_;
  if (errno_ < 0) { /* restart / error: no access (as kvm_pairing names them) */
    e->subkind = KS_SUB_NONE;
    e->subkey = 0;
    e->size = 0;
    e->dir = KS_DIR_NONE;
  }
  KS_SM_BARRIER();
  t->phase = KS_USER_EXIT;
}

#endif /* EXITSCOPE_SOURCES_BPF_KVM_PAIR_SM_H_ */
