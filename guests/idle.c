/* idle: a HLT loop with periodic work. Each round does a little computation, halts (int3 ->
 * CPL0 `hlt`, one KVM_EXIT_HLT; the VMM wakes the vCPU at its next 1 ms tick) and every 100
 * rounds leaves a marker. arg = rounds (default 500; the VMM's --duration may stop it first). */
#include "lib/guest.h"

int guest_main(u32 vcpu, u32 nvcpus, u64 arg) {
  (void)nvcpus;
  u64 rounds = arg ? arg : 500;
  u64 acc = vcpu + 1;
  for (u64 r = 0; r < rounds; ++r) {
    for (int i = 0; i < 1000; ++i) acc = acc * 6364136223846793005ull + 1442695040888963407ull;
    barrier();
    halt();
    if (r % 100 == 99) debug_marker((u32)(vcpu << 24 | (r + 1)));
  }
  if (acc == 0) return ES_FAIL_GENERIC; /* keeps the work from being optimised away */
  uart_line("idle: vCPU ", vcpu, " done after ", rounds, " halts");
  return 0;
}
