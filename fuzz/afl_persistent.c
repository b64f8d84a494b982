/* fuzz/afl_persistent.c: AFL++'s persistent mode for classic afl-g++ (afl-as) builds.
 *
 * Classic afl-g++ links no AFL++ runtime: no __AFL_LOOP, no deferred forkserver, and the
 * forkserver that afl-as injects (at the first instrumented block) forks once per input and
 * does not resume a child that stopped itself (docs/fuzzing.md). This file is C, compiled by
 * plain gcc (CC stays gcc in `make fuzz`), so nothing here is instrumented, and it runs a
 * forkserver of its own before any instrumented code:
 *
 *   afl-fuzz --ctl fd 198--> forkserver (constructor below) --fork/SIGCONT--> child
 *            <-st fd 199---                                 <--SIGSTOP/exit--
 *
 * The protocol is AFL++ 4.04c's old-style one (no option bits in the hello): afl-fuzz writes
 * 4 bytes ("was the last child killed") per run, reads the child's pid, then its wait
 * status. A child that stopped itself with SIGSTOP (exitscope_afl_loop, after each input) is
 * resumed with SIGCONT for the next input instead of forking a new one; after
 * kPersistentIterations inputs the child exits and the next run forks afresh. The child
 * closes fds 198 and 199 before returning into the program, so afl-as's own setup there maps
 * the coverage map (__AFL_SHM_ID) and finds no forkserver pipe: it simply runs.
 *
 * Outside afl-fuzz (no __AFL_SHM_ID, or fd 199 not open) the constructor returns at once and
 * exitscope_afl_loop lets one input through.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "afl_persistent.h"

enum { kCtlFd = 198, kStFd = 199, kPersistentIterations = 10000 };

/* afl-fuzz looks for this string in the binary to know it is persistent. */
const char exitscope_afl_persistent_sig[] __attribute__((used)) = "##SIG_AFL_PERSISTENT##";

static int forkserver_child; /* 1 in a child started by the forkserver below */

static int WriteAll(int fd, const void* p) {
  return write(fd, p, 4) == 4;
}

__attribute__((constructor(101))) static void StartForkserver(void) {
  if (!getenv("__AFL_SHM_ID")) return;
  const char* per_input = getenv("EXITSCOPE_FUZZ_FORK_PER_INPUT");
  if (per_input && *per_input == '1') return; /* afl-as's forkserver: one fork per input */
  const unsigned hello = 0;
  if (!WriteAll(kStFd, &hello)) return; /* not under afl-fuzz's forkserver protocol */
  pid_t child = -1;
  int child_stopped = 0;
  for (;;) {
    unsigned was_killed;
    if (read(kCtlFd, &was_killed, 4) != 4) _exit(0); /* afl-fuzz went away */
    int status;
    if (child_stopped && was_killed) { /* afl-fuzz killed the stopped child (timeout) */
      child_stopped = 0;
      if (waitpid(child, &status, 0) < 0) _exit(1);
    }
    if (!child_stopped) {
      child = fork();
      if (child < 0) _exit(1);
      if (child == 0) {
        close(kCtlFd);
        close(kStFd);
        forkserver_child = 1;
        return;
      }
    } else {
      kill(child, SIGCONT);
      child_stopped = 0;
    }
    if (!WriteAll(kStFd, &child)) _exit(1);
    if (waitpid(child, &status, WUNTRACED) < 0) _exit(1);
    if (WIFSTOPPED(status)) child_stopped = 1;
    if (!WriteAll(kStFd, &status)) _exit(1);
  }
}

int exitscope_afl_loop(void) {
  static unsigned runs;
  if (runs == 0) return ++runs;
  if (!forkserver_child || runs >= kPersistentIterations) return 0;
  ++runs;
  raise(SIGSTOP); /* this input is done: the forkserver reports it and resumes us */
  return 1;
}
