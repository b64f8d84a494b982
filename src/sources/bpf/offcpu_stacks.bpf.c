// SPDX-License-Identifier: GPL-2.0
/* sources/bpf/offcpu_stacks.bpf.c: `--stacks` of `exitscope kvm stat --bpf`: for each thread
 * inside a KVM exit, where it went off the CPU (kernel and user stack at sched_switch) and
 * for how long. A second object next to kvm_stat.bpf.c, loaded only with --stacks.
 *
 * Inside an exit: from kvm_exit (VMX/SVM) or kvm_userspace_exit to kvm_entry or the thread's
 * next ioctl(KVM_RUN); or marked by userspace through os_threads (offcpu_stacks_abi.h).
 * sched_switch: the thread switching out, if inside an exit, gets its two stacks stored
 * (bpf_get_stackid, ~5.8 us here) and its off-CPU period starts; the thread switching in,
 * if inside an exit, adds the period to the site (kernel stack, user stack) it left from.
 * When an exit ends after cfg.slow_ns or more, its thread entry goes to the ring buffer.
 * Every map is bounded; what does not fit is counted in os_counters.
 */
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "offcpu_stacks_abi.h"

char LICENSE[] SEC("license") = "GPL";

const volatile struct os_config cfg = {};

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, OS_MAX_THREADS);
  __type(key, __u32);
  __type(value, struct os_thread);
} os_threads SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_STACK_TRACE);
  __uint(max_entries, OS_DEFAULT_STACKS); /* the loader may set another size */
  __uint(key_size, sizeof(__u32));
  __uint(value_size, OS_STACK_DEPTH * sizeof(__u64));
} os_stacks SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, OS_RING_BYTES);
} os_ended SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct os_counters);
} os_counters SEC(".maps");

static __always_inline struct os_counters* counters(void) {
  __u32 zero = 0;
  return bpf_map_lookup_elem(&os_counters, &zero);
}

static const struct os_thread zero_thread = {};

/* The current thread enters an exit (kept if it is inside one: kvm_exit then
 * kvm_userspace_exit is one exit). */
static __always_inline void mark(__u32 kind) {
  __u64 id = bpf_get_current_pid_tgid();
  __u32 tgid = id >> 32, tid = (__u32)id;
  if (cfg.target_tgid != 0 && tgid != cfg.target_tgid) return;
  struct os_thread* t = bpf_map_lookup_elem(&os_threads, &tid);
  if (t == 0) {
    if (bpf_map_update_elem(&os_threads, &tid, &zero_thread, BPF_NOEXIST) != 0) {
      struct os_counters* c = counters();
      if (c) c->threads_full++;
      return;
    }
    t = bpf_map_lookup_elem(&os_threads, &tid);
    if (t == 0) return;
  }
  if (t->exit_ts != 0) {
    t->kind |= kind;
    return;
  }
  __builtin_memset(t, 0, sizeof *t);
  t->tgid = tgid;
  t->tid = tid;
  t->kind = kind;
  t->exit_ts = bpf_ktime_get_ns();
}

/* The current thread's exit ends (it runs: no off-CPU period is in progress). */
static __always_inline void end(void) {
  __u32 tid = (__u32)bpf_get_current_pid_tgid();
  struct os_thread* t = bpf_map_lookup_elem(&os_threads, &tid);
  if (t == 0 || t->exit_ts == 0) return;
  __u64 now = bpf_ktime_get_ns();
  struct os_counters* c = counters();
  if (c) c->ended++;
  if (now - t->exit_ts >= cfg.slow_ns) {
    t->end_ts = now;
    if (c) c->slow++;
    if (bpf_ringbuf_output(&os_ended, t, sizeof *t, 0) != 0 && c) c->ended_dropped++;
  }
  t->exit_ts = 0;
}

SEC("tracepoint/kvm/kvm_exit")
int os_kvm_exit(void* ctx) {
  mark(OS_KIND_KERNEL);
  return 0;
}

SEC("tracepoint/kvm/kvm_userspace_exit")
int os_kvm_userspace_exit(void* ctx) {
  mark(OS_KIND_USERSPACE);
  return 0;
}

SEC("tracepoint/kvm/kvm_entry")
int os_kvm_entry(void* ctx) {
  end();
  return 0;
}

SEC("tracepoint/syscalls/sys_enter_ioctl")
int os_sys_enter_ioctl(struct trace_event_raw_sys_enter* ctx) {
  if ((__u32)BPF_CORE_READ(ctx, args[1]) != OS_KVM_RUN) return 0;
  end();
  return 0;
}

static __always_inline void add_period(struct os_thread* t, __u64 d) {
  t->off_ns += d;
  for (int i = 0; i < OS_SITES; i++) {
    struct os_site* s = &t->site[i];
    if (i < t->sites) {
      if (s->kstack != t->cur_kstack || s->ustack != t->cur_ustack) continue;
    } else {
      t->sites = i + 1;
      s->kstack = t->cur_kstack;
      s->ustack = t->cur_ustack;
    }
    s->off_ns += d;
    s->switches++;
    s->preempted += t->cur_preempted;
    return;
  }
  t->other_off_ns += d;
  t->other_switches++;
}

SEC("tracepoint/sched/sched_switch")
int os_sched_switch(struct trace_event_raw_sched_switch* ctx) {
  __u32 prev = (__u32)BPF_CORE_READ(ctx, prev_pid);
  __u32 next = (__u32)BPF_CORE_READ(ctx, next_pid);
  __u64 now = 0;
  struct os_thread* t = bpf_map_lookup_elem(&os_threads, &next);
  if (t && t->exit_ts != 0 && t->off_ts != 0) {
    now = bpf_ktime_get_ns();
    add_period(t, now - t->off_ts);
    t->off_ts = 0;
  }
  t = bpf_map_lookup_elem(&os_threads, &prev);
  if (t == 0 || t->exit_ts == 0) return 0;
  /* the stacks of the thread switching out: this runs in its context */
  long k = bpf_get_stackid(ctx, &os_stacks, 0);
  long u = bpf_get_stackid(ctx, &os_stacks, BPF_F_USER_STACK);
  struct os_counters* c = counters();
  if (c) {
    c->captures++;
    c->stack_drops += (k < 0) + (u < 0);
  }
  t->stack_drops += (k < 0) + (u < 0);
  t->cur_kstack = (__s32)k;
  t->cur_ustack = (__s32)u;
  t->cur_preempted = BPF_CORE_READ(ctx, prev_state) == 0; /* TASK_RUNNING: preempted */
  t->switches++;
  t->off_ts = now != 0 ? now : bpf_ktime_get_ns();
  return 0;
}
