#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
static int fds[2];
static volatile int tid_pipe, tid_vfork;
static int child(void* a) {
  struct timespec ts = {2, 0};
  syscall(SYS_nanosleep, &ts, 0);
  return 0;
}
static void* reader(void* a) {
  tid_pipe = syscall(SYS_gettid);
  char c;
  read(fds[0], &c, 1);
  return 0;
}
static char stk[65536] __attribute__((aligned(16)));
static void* vf(void* a) {
  tid_vfork = syscall(SYS_gettid);
  pid_t p = clone(child, stk + sizeof stk, CLONE_VFORK | CLONE_VM | SIGCHLD, 0);
  waitpid(p, 0, 0);
  return 0;
}
static void cp(int tid, const char* f, const char* out) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "cat /proc/self/../%d/task/%d/%s > %s", getpid(), tid, f, out);
  system(cmd);
}
int main() {
  pipe(fds);
  pthread_t a, b;
  pthread_create(&a, 0, reader, 0);
  pthread_create(&b, 0, vf, 0);
  sleep(1);
  cp(tid_pipe, "stat", "pipe-read.stat");
  cp(tid_pipe, "stack", "pipe-read.stack");
  cp(tid_pipe, "syscall", "pipe-read.syscall");
  cp(tid_vfork, "stat", "vfork-wait.stat");
  cp(tid_vfork, "stack", "vfork-wait.stack");
  cp(tid_vfork, "syscall", "vfork-wait.syscall");
  write(fds[1], "x", 1);
  pthread_join(a, 0);
  pthread_join(b, 0);
  return 0;
}
