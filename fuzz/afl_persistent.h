/* fuzz/afl_persistent.h: persistent mode for classic afl-g++ builds (afl_persistent.c). */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* __AFL_LOOP's contract: returns non-zero while the caller should read and run one more
 * input. The first call returns 1 at once; each later call reports the previous input as
 * done (SIGSTOP to the forkserver) and returns 1 when afl-fuzz has the next one ready, or 0
 * after a fixed number of inputs (the process then exits and afl-fuzz forks a fresh one).
 * Outside afl-fuzz it returns 1 once. */
int exitscope_afl_loop(void);

#ifdef __cplusplus
}
#endif
