/* sources/bpf/offcpu_stacks_abi.h: the maps shared by offcpu_stacks.bpf.c (`--stacks` of
 * `exitscope kvm stat --bpf`: where vCPU threads inside an exit went off the CPU) and its
 * loader (bpf_offcpu_loader.cc). Plain C, fixed-width types only (docs/kvm-stacks.md).
 *
 * Maps:
 *   os_threads  hash  tid -> os_thread      the threads inside an exit (exit_ts != 0) and
 *                                           threads that were (exit_ts == 0, kept for reuse)
 *   os_stacks   stack trace [config]        kernel and user stacks, deduplicated by the kernel
 *                                           (bpf_get_stackid; ids in os_site)
 *   os_ended    ring buffer                 one os_thread per exit that ended after it lasted
 *                                           cfg.slow_ns or more
 *   os_counters percpu array [1] os_counters what was dropped
 *
 * os_threads is the program's interface for marking too: "inside an exit" starts at
 * kvm_exit (VMX/SVM) or kvm_userspace_exit and ends at kvm_entry or at the thread's next
 * ioctl(KVM_RUN) (syscalls:sys_enter_ioctl, cmd 0xae80). Userspace may mark a thread itself by
 * writing an entry {tgid, tid, exit_ts = CLOCK_MONOTONIC now, everything else 0}: the program
 * then treats it as inside an exit (BpfOffCpuStacks::MarkInside; the tests do so, as no
 * kvm tracepoint fires on a host without KVM).
 */
#ifndef EXITSCOPE_SOURCES_BPF_OFFCPU_STACKS_ABI_H_
#define EXITSCOPE_SOURCES_BPF_OFFCPU_STACKS_ABI_H_

#define OS_MAX_THREADS 4096
#define OS_STACK_DEPTH 64       /* frames per stack (the stack map's value: 8 bytes a frame) */
#define OS_DEFAULT_STACKS 16384 /* stack map entries, a power of two (BpfOffCpuOptions) */
#define OS_SITES 4              /* distinct (kernel, user) stack pairs kept per exit */
#define OS_RING_BYTES (1u << 20)
#define OS_KVM_RUN 0xae80u /* KVM_RUN */

/* os_thread.kind: what marked the exit */
#define OS_KIND_KERNEL 1u    /* kvm_exit */
#define OS_KIND_USERSPACE 2u /* kvm_userspace_exit (or after kvm_exit) */
#define OS_KIND_MARKED 4u    /* written by userspace (MarkInside) */

/* One place the thread went off the CPU during the exit. Stack ids < 0: not stored
 * (-errno of bpf_get_stackid: -EEXIST a different stack holds its bucket, -EFAULT none). */
struct os_site {
  __s32 kstack;
  __s32 ustack;
  __u64 off_ns;    /* time off the CPU after switching out here, summed */
  __u32 switches;  /* times it switched out here */
  __u32 preempted; /* of which while runnable (preempted, not blocked) */
};

struct os_thread {
  __u32 tgid;
  __u32 tid;
  __u64 exit_ts;                /* start of the exit, CLOCK_MONOTONIC ns; 0: not inside one */
  __u64 end_ts;                 /* os_ended: when it ended */
  __u64 off_ts;                 /* went off the CPU at (0: on the CPU) */
  __u64 off_ns;                 /* off the CPU inside this exit, ns (periods that ended) */
  __u32 switches;               /* switch-outs inside this exit */
  __u32 kind;                   /* OS_KIND_* */
  __s32 cur_kstack, cur_ustack; /* the stacks of the period in progress (off_ts != 0) */
  __u32 cur_preempted;
  __u32 other_switches; /* periods whose stacks found no free os_site */
  __u64 other_off_ns;
  __u32 stack_drops; /* stacks not stored in this exit (map full, bucket taken) */
  __u32 sites;       /* os_site entries used */
  struct os_site site[OS_SITES];
};

struct os_counters {
  __u64 threads_full;  /* marks lost: os_threads full */
  __u64 stack_drops;   /* stacks not stored: os_stacks full or its bucket taken */
  __u64 ended_dropped; /* slow exits lost: os_ended full (userspace did not drain it) */
  __u64 ended;         /* exits that ended inside the program's view */
  __u64 slow;          /* of which slow (sent to os_ended) */
  __u64 captures;      /* switch-outs captured (two bpf_get_stackid each) */
};

struct os_config {
  __u32 target_tgid; /* 0: every process */
  __u32 pad;
  __u64 slow_ns; /* an exit this long or longer goes to os_ended */
};

#endif /* EXITSCOPE_SOURCES_BPF_OFFCPU_STACKS_ABI_H_ */
