// tests/support/run.h: what the tests that run programs share. Running a command with its
// output captured, the exitscope binary of this build, and skipping without /dev/kvm.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace exitscope::test {

// The exitscope binary this build made.
inline std::string ExitscopeBinary() {
  return std::string(EXITSCOPE_BINARY_DIR) + "/exitscope";
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Ran {
  int status = -1;  // exit status, 128 + signal when killed, -1 when it could not start
  std::string out, err;
};

// Runs argv (argv[0] searched in PATH), stdin from /dev/null. stdout and stderr go to temporary
// files, so a chatty program cannot block on a full pipe; with merge_stderr both land in `out`
// in the order written. `on_start` gets the pid while the program runs.
inline Ran Run(const std::vector<std::string>& argv,
               const std::function<void(pid_t)>& on_start = {}, bool merge_stderr = false) {
  char out_tmpl[] = "/tmp/exitscope-test-out-XXXXXX";
  char err_tmpl[] = "/tmp/exitscope-test-err-XXXXXX";
  const int out = ::mkstemp(out_tmpl), err = ::mkstemp(err_tmpl);
  Ran r;
  if (out < 0 || err < 0 || argv.empty()) {
    r.err = std::string("cannot start: ") + std::strerror(errno);
  } else if (const pid_t pid = ::fork(); pid == 0) {
    const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(merge_stderr ? out : err, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  } else if (pid > 0) {
    if (on_start) on_start(pid);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = ReadFile(out_tmpl);
    r.err = ReadFile(err_tmpl);
  }
  if (out >= 0) ::close(out), ::unlink(out_tmpl);
  if (err >= 0) ::close(err), ::unlink(err_tmpl);
  return r;
}

// `sh -c CMD`; stdout and stderr merged into `out` unless merge_stderr is false.
inline Ran RunShell(const std::string& cmd, bool merge_stderr = true) {
  return Run({"/bin/sh", "-c", cmd}, {}, merge_stderr);
}

// This build's exitscope with ARGS as a shell would split them; output merged unless told.
inline Ran RunExitscope(const std::string& args, bool merge_stderr = true) {
  return RunShell(ExitscopeBinary() + " " + args, merge_stderr);
}

// A loopback TCP port free right now, for a program under test to listen on (0: none found).
inline uint16_t FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Empty when /dev/kvm opens read-write, else why not.
inline std::string KvmUnavailable() {
  const int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) return std::string("/dev/kvm not available: ") + std::strerror(errno);
  ::close(fd);
  return {};
}

}  // namespace exitscope::test

#define SKIP_WITHOUT_KVM()                                                         \
  do {                                                                             \
    if (const std::string why = ::exitscope::test::KvmUnavailable(); !why.empty()) \
      GTEST_SKIP() << why;                                                         \
  } while (0)
