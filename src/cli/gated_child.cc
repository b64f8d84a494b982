#include "cli/gated_child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fmt/format.h"

namespace exitscope::cli {

Result<pid_t> GatedChild::Spawn(const std::vector<std::string>& cmd) {
  if (::pipe2(go_, O_CLOEXEC) != 0 || ::pipe2(err_, O_CLOEXEC) != 0) {
    return Fail(ErrorCode::kIo, fmt::format("pipe: {}", std::strerror(errno)));
  }
  pid_ = ::fork();
  if (pid_ < 0) return Fail(ErrorCode::kIo, fmt::format("fork: {}", std::strerror(errno)));
  if (pid_ == 0) {
    ::close(go_[1]);
    ::close(err_[0]);
    char c = 0;
    if (::read(go_[0], &c, 1) != 1 || c != 'g') ::_exit(127);
    std::vector<char*> argv;
    for (const std::string& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    const int e = errno;
    (void)!::write(err_[1], &e, sizeof e);
    ::_exit(127);
  }
  ::close(go_[0]);
  ::close(err_[1]);
  go_[0] = err_[1] = -1;
  return pid_;
}

int GatedChild::Go() {
  (void)!::write(go_[1], "g", 1);
  ::close(go_[1]);
  go_[1] = -1;
  int e = 0;
  const ssize_t n = ::read(err_[0], &e, sizeof e);
  ::close(err_[0]);
  err_[0] = -1;
  return n == static_cast<ssize_t>(sizeof e) ? e : 0;
}

bool GatedChild::Exited() {
  if (pid_ <= 0 || exited_) return true;
  if (::waitpid(pid_, &status_, WNOHANG) == pid_) exited_ = true;
  return exited_;
}

void GatedChild::Stop(int sig) {
  if (Exited()) return;
  ::kill(pid_, sig);
  for (int i = 0; i < 300 && !Exited(); ++i) ::usleep(10'000);
  if (!Exited()) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
    exited_ = true;
  }
}

GatedChild::~GatedChild() {
  for (int fd : {go_[0], go_[1], err_[0], err_[1]})
    if (fd >= 0) ::close(fd);
  if (pid_ > 0 && !exited_) Stop(SIGKILL);
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return "ended";
}

}  // namespace exitscope::cli
