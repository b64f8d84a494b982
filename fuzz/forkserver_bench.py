#!/usr/bin/env python3
"""fuzz/forkserver_bench.py TARGET INPUT N: drives TARGET through AFL++'s forkserver protocol as afl-fuzz
does (coverage map in SysV shm, control on fd 198, status on fd 199, input on stdin) for N
inputs, and prints the CPU time the target's process tree used per input (perf stat
task-clock), without afl-fuzz's own work and independent of how loaded the machine is."""
import ctypes, os, struct, subprocess, sys, tempfile, time
target, inp, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0, 1 << 16, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
data = open(inp, 'rb').read()
cur = tempfile.TemporaryFile()
cur.write(data); cur.flush()
ctl_r, ctl_w = os.pipe(); st_r, st_w = os.pipe()
perf_out = tempfile.NamedTemporaryFile(delete=False).name
pid = os.fork()
if pid == 0:
    os.dup2(ctl_r, 198); os.dup2(st_w, 199); os.dup2(cur.fileno(), 0)
    os.environ['__AFL_SHM_ID'] = str(shm)
    os.execvp('perf', ['perf', 'stat', '-x,', '-e', 'task-clock', '-o', perf_out, '--', target])
os.close(ctl_r); os.close(st_w)
assert len(os.read(st_r, 4)) == 4, 'no forkserver hello'
t0 = time.monotonic()
child = None
for i in range(n):
    os.write(ctl_w, b'\0\0\0\0')
    child = struct.unpack('I', os.read(st_r, 4))[0]
    status = struct.unpack('I', os.read(st_r, 4))[0]
wall = time.monotonic() - t0
try: os.kill(child, 9)
except ProcessLookupError: pass
os.close(ctl_w)
os.waitpid(pid, 0)
libc.shmctl(shm, 0, None)  # IPC_RMID
ms = float(open(perf_out).read().strip().splitlines()[-1].split(',')[0])
mode = 'fork-per-input' if os.environ.get('EXITSCOPE_FUZZ_FORK_PER_INPUT') == '1' else 'persistent'
print(f'{os.path.basename(target)} {mode}: {n} inputs, target CPU {ms:.0f} ms = {ms * 1000 / n:.0f} us/input, wall {wall:.1f} s')
