// cli/gated_child.h: the CMD of `kvm record -- CMD` and `kvm stat -- CMD`, started once the
// parent says go (so tracing or counting is on before its first instruction), with an exec
// failure reported back through a close-on-exec pipe.
//
//   GatedChild c;
//   auto pid = c.Spawn({"qemu-system-x86_64", ...});   // forked, waiting
//   ... attach to *pid ...
//   if (int e = c.Go(); e != 0) ...                      // exec failed: errno e
//   while (!c.Exited()) ...;  DescribeStatus(c.status())
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "exitscope/status.h"

namespace exitscope::cli {

class GatedChild {
 public:
  GatedChild() = default;
  GatedChild(const GatedChild&) = delete;
  GatedChild& operator=(const GatedChild&) = delete;
  ~GatedChild();  // kills a child still running (SIGKILL)

  // Forks; the child waits for Go(), then execvp()s cmd (PATH searched).
  Result<pid_t> Spawn(const std::vector<std::string>& cmd);
  // Lets the child exec; returns the exec errno (0 when it started).
  int Go();
  // True once the child has exited (status kept), or when there is none.
  bool Exited();
  // Sends sig, waits up to 3 s, then SIGKILL.
  void Stop(int sig);
  pid_t pid() const { return pid_; }
  int status() const { return status_; }  // waitpid() status once Exited()

 private:
  int go_[2] = {-1, -1};
  int err_[2] = {-1, -1};
  pid_t pid_ = -1;
  int status_ = 0;
  bool exited_ = false;
};

// "exited with status N", "killed by signal N" or "ended".
std::string DescribeStatus(int status);

}  // namespace exitscope::cli
