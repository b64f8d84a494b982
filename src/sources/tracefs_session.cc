// sources/tracefs_session.cc: the session's lifetime (TracefsSession): which events and which
// buffer (a private instance created and removed, or an existing buffer snapshotted and
// restored), the clock, buffer size and pid filter it applies, Start, Stop and Close.
#include "sources/tracefs_session.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "base/clock_name.h"
#include "fmt/format.h"
#include "sources/tracefs_session_internal.h"

namespace exitscope::sources {

using tracefs_internal::Errno;
using tracefs_internal::Exists;
using tracefs_internal::IsDir;
using tracefs_internal::ListDir;
using tracefs_internal::Trim;

namespace {

constexpr const char* kInstancePrefix = "exitscope-";

// Removes private instances left behind by exitscope processes that no longer exist.
void RemoveStaleInstances(const std::string& tracefs) {
  for (const std::string& name : ListDir(tracefs + "/instances", true)) {
    if (name.rfind(kInstancePrefix, 0) != 0) continue;
    const char* digits = name.c_str() + std::strlen(kInstancePrefix);
    char* end = nullptr;
    const long pid = std::strtol(digits, &end, 10);
    if (end == digits || *end != '\0' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    ::rmdir((tracefs + "/instances/" + name).c_str());
  }
}

}  // namespace

Result<std::unique_ptr<TracefsSession>> TracefsSession::Open(const TracefsOptions& options) {
  auto dir = FindTracefs(options.tracefs_dir, options.mount_if_missing);
  if (!dir) return Propagate(dir);
  if (options.top_level && !options.instance.empty()) {
    return Fail(ErrorCode::kInvalidArgument, "choose either the top-level buffer or an instance");
  }
  std::unique_ptr<TracefsSession> s(new TracefsSession());
  s->tracefs_dir_ = *dir;

  // Which events, which systems.
  std::vector<std::string> events;
  std::set<std::string> systems;
  for (const std::string& spec : options.events) {
    const size_t colon = spec.find(':');
    const std::string sys = spec.substr(0, colon);
    const std::string ev = colon == std::string::npos ? "*" : spec.substr(colon + 1);
    if (sys.empty() || ev.empty() || sys.find('/') != std::string::npos ||
        ev.find('/') != std::string::npos || sys == "." || sys == ".." || ev == "." || ev == "..") {
      return Fail(ErrorCode::kInvalidArgument,
                  fmt::format("event '{}': expected SYSTEM:EVENT, SYSTEM:* or SYSTEM", spec));
    }
    const std::string sysdir = s->tracefs_dir_ + "/events/" + sys;
    if (!IsDir(sysdir)) {
      return Fail(ErrorCode::kInvalidArgument,
                  fmt::format("event '{}': this kernel has no event system '{}' ({}/events)", spec,
                              sys, s->tracefs_dir_));
    }
    if (ev == "*") {
      for (const std::string& e : ListDir(sysdir, true)) events.push_back(sys + ":" + e);
    } else if (IsDir(sysdir + "/" + ev)) {
      events.push_back(sys + ":" + ev);
    } else {
      return Fail(ErrorCode::kInvalidArgument,
                  fmt::format("event '{}': this kernel has no event {}/{}", spec, sys, ev));
    }
    systems.insert(sys);
  }
  s->systems_.assign(systems.begin(), systems.end());

  // Which buffer.
  if (options.top_level) {
    s->buffer_dir_ = s->tracefs_dir_;
  } else if (!options.instance.empty()) {
    if (options.instance.find('/') != std::string::npos) {
      return Fail(ErrorCode::kInvalidArgument,
                  fmt::format("instance '{}': not a plain name", options.instance));
    }
    s->buffer_dir_ = s->tracefs_dir_ + "/instances/" + options.instance;
    if (!IsDir(s->buffer_dir_)) {
      return Fail(ErrorCode::kNotFound,
                  fmt::format("tracefs instance '{}' does not exist ({}): create it with "
                              "`mkdir {}` or omit --instance",
                              options.instance, s->buffer_dir_, s->buffer_dir_));
    }
  } else {
    RemoveStaleInstances(s->tracefs_dir_);
    s->buffer_dir_ = fmt::format("{}/instances/{}{}", s->tracefs_dir_, kInstancePrefix, ::getpid());
    if (::mkdir(s->buffer_dir_.c_str(), 0700) != 0) {
      const int err = errno;
      return Fail(err == EACCES || err == EPERM ? ErrorCode::kPermission : ErrorCode::kIo,
                  fmt::format("cannot create tracefs instance {}: {}", s->buffer_dir_, Errno(err)));
    }
    s->owns_instance_ = true;
  }

  if (!s->owns_instance_) {
    auto saved = TracefsSettings::Capture(s->buffer_dir_, s->systems_);
    if (!saved) {
      s->closed_ = true;
      return Propagate(saved);
    }
    s->saved_ = std::make_unique<TracefsSettings>(std::move(*saved));
  }

  for (const std::string& cpu : ListDir(s->buffer_dir_ + "/per_cpu", true)) {
    if (cpu.rfind("cpu", 0) == 0) s->cpus_ = std::max(s->cpus_, std::atoi(cpu.c_str() + 3) + 1);
  }
  s->subbuf_size_ = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (auto kb = ReadTracefsFile(s->buffer_dir_ + "/buffer_subbuf_size_kb"); kb) {
    const long v = std::atol(kb->c_str());
    if (v > 0) s->subbuf_size_ = static_cast<size_t>(v) * 1024;
  }

  // From here on a failure restores through Close().
  Status st = s->Apply(options);
  if (!st) {
    (void)s->Close();
    return Propagate(st);
  }
  s->enabled_ = std::move(events);
  for (const std::string& e : s->enabled_) {
    const size_t colon = e.find(':');
    const std::string path =
        s->buffer_dir_ + "/events/" + e.substr(0, colon) + "/" + e.substr(colon + 1) + "/enable";
    if (!Exists(path)) continue;  // e.g. ftrace:print is always on
    st = WriteTracefsFile(path, "1");
    if (!st) {
      (void)s->Close();
      return Propagate(st);
    }
  }
  return s;
}

Status TracefsSession::Apply(const TracefsOptions& options) {
  if (Status st = WriteTracefsFile(buffer_dir_ + "/tracing_on", "0"); !st) return st;

  auto clocks = ReadTracefsFile(buffer_dir_ + "/trace_clock");
  if (!clocks) return Propagate(clocks);
  clock_ = base::SelectedClock(*clocks);
  for (const std::string& want : options.clocks) {
    // Offered clocks are space separated, the current one in brackets.
    const bool offered = (" " + Trim(*clocks) + " ").find(" " + want + " ") != std::string::npos;
    if (want == clock_) break;
    if (offered) {
      if (Status st = WriteTracefsFile(buffer_dir_ + "/trace_clock", want); !st) return st;
      clock_ = want;
      break;
    }
  }

  if (options.buffer_kb > 0) {
    Status st =
        WriteTracefsFile(buffer_dir_ + "/buffer_size_kb", std::to_string(options.buffer_kb));
    if (!st) return st;
  }

  // A fresh filter list: only our process (or none).
  if (Status st = WriteTracefsFile(buffer_dir_ + "/set_event_pid", ""); !st) return st;
  if (options.pid > 0) {
    if (::kill(options.pid, 0) != 0 && errno == ESRCH) {
      return Fail(ErrorCode::kInvalidArgument, fmt::format("-p {}: no such process", options.pid));
    }
    if (Exists(buffer_dir_ + "/options/event-fork")) {
      Status st = WriteTracefsFile(buffer_dir_ + "/options/event-fork",
                                   options.follow_children ? "1" : "0");
      if (!st) return st;
    }
    if (Status st = AddPid(options.pid); !st) return st;
  }
  return {};
}

Status TracefsSession::AddPid(pid_t pid) {
  std::vector<std::string> tids = ListDir(fmt::format("/proc/{}/task", pid), true);
  if (tids.empty()) tids.push_back(std::to_string(pid));
  const std::string path = buffer_dir_ + "/set_event_pid";
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) {
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot open: {}", path, Errno(errno)));
  }
  for (const std::string& tid : tids) {
    const std::string v = tid + " ";
    if (::write(fd, v.data(), v.size()) < 0 && errno != ESRCH) {
      const int err = errno;
      ::close(fd);
      return Fail(ErrorCode::kIo, fmt::format("{}: adding pid {}: {}", path, tid, Errno(err)));
    }
  }
  ::close(fd);
  return {};
}

Status TracefsSession::Start() {
  return WriteTracefsFile(buffer_dir_ + "/tracing_on", "1");
}

Status TracefsSession::Stop() {
  return WriteTracefsFile(buffer_dir_ + "/tracing_on", "0");
}

Status TracefsSession::Close() {
  if (closed_) return {};
  closed_ = true;
  if (owns_instance_) {
    (void)WriteTracefsFile(buffer_dir_ + "/tracing_on", "0");
    // Events are per instance; removing the instance drops them. The kernel refuses while a
    // pipe of the instance is open (EBUSY): the caller closes readers first.
    if (::rmdir(buffer_dir_.c_str()) != 0) {
      return Fail(ErrorCode::kIo,
                  fmt::format("cannot remove tracefs instance {}: {}", buffer_dir_, Errno(errno)));
    }
    return {};
  }
  if (saved_) return saved_->Restore();
  return {};
}

TracefsSession::~TracefsSession() {
  (void)Close();
}

}  // namespace exitscope::sources
