// sources/tracefs_session.cc: see tracefs_session.h.
#include "sources/tracefs_session.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>

#include "base/clock_name.h"
#include "fmt/format.h"

namespace exitscope::sources {
namespace {

constexpr long kTracefsMagic = 0x74726163;  // "trac": TRACEFS_MAGIC in linux/magic.h
constexpr const char* kInstancePrefix = "exitscope-";

std::string Errno(int err) {
  return std::strerror(err);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> ListDir(const std::string& path, bool dirs_only) {
  std::vector<std::string> out;
  DIR* d = ::opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (dirs_only && !IsDir(path + "/" + e->d_name)) continue;
    out.emplace_back(e->d_name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

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

// Files a restore writes, in the order it writes them. Lower rank first.
int RestoreRank(const std::string& rel) {
  // events/SYS/EVENT/enable; events/SYS/enable only summarises its events ("X" when mixed).
  if (rel.ends_with("/enable")) return std::count(rel.begin(), rel.end(), '/') == 3 ? 0 : -1;
  if (rel.ends_with("/filter")) return 1;
  if (rel == "set_event_pid") return 2;
  if (rel == "options/event-fork") return 3;
  if (rel == "trace_clock") return 4;
  if (rel == "buffer_size_kb") return 5;
  if (rel.starts_with("per_cpu/")) return 6;
  if (rel == "tracing_on") return 7;
  return -1;  // derived: compared, never written
}

bool IsBufferSizeFile(const std::string& rel) {
  return rel == "buffer_size_kb" ||
         (rel.starts_with("per_cpu/") && rel.ends_with("/buffer_size_kb"));
}

// What to write to `rel` so that reading it gives `content` back (for a buffer that was never
// expanded: the size it expands to, see TracefsSettings).
std::string RestoreValue(const std::string& rel, const std::string& content) {
  const std::string t = Trim(content);
  if (rel.ends_with("/filter")) return t == "none" ? "0" : t;
  if (rel == "trace_clock") return base::SelectedClock(content);
  if (rel == "set_event_pid") {
    std::string v = t;
    std::replace(v.begin(), v.end(), '\n', ' ');
    return v;
  }
  if (IsBufferSizeFile(rel)) {
    if (auto size = ParseBufferSizeKb(t); size && !size->mixed)
      return std::to_string(size->expanded_kb.value_or(size->kb));
    return t;
  }
  if (rel.ends_with("/enable")) return t.substr(0, 1);  // "1*" (soft mode) -> "1"
  return t;
}

// Parses a decimal number that makes up all of `s`.
std::optional<uint64_t> ParseDecimal(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

// Bytes of data per page from an events/header_page file ("field: char data; offset:16;
// size:4080; ..."); 0 when it does not say.
uint64_t HeaderPageDataBytes(const std::string& header_page) {
  const size_t field = header_page.find("char data;");
  if (field == std::string::npos) return 0;
  const size_t size = header_page.find("size:", field);
  if (size == std::string::npos) return 0;
  const size_t end = header_page.find(';', size);
  if (end == std::string::npos) return 0;
  return ParseDecimal(std::string_view(header_page).substr(size + 5, end - size - 5)).value_or(0);
}

uint64_t PagesFor(uint64_t kb, uint64_t page_data_bytes) {
  return (kb * 1024 + page_data_bytes - 1) / page_data_bytes;
}

}  // namespace

Result<std::string> ReadTracefsFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return Fail(err == EACCES || err == EPERM ? ErrorCode::kPermission : ErrorCode::kIo,
                fmt::format("{}: cannot open: {}", path, Errno(err)));
  }
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Fail(ErrorCode::kIo, fmt::format("{}: read failed: {}", path, Errno(err)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Status WriteTracefsFile(const std::string& path, const std::string& value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return Fail(err == EACCES || err == EPERM ? ErrorCode::kPermission : ErrorCode::kIo,
                fmt::format("{}: cannot open for writing: {}", path, Errno(err)));
  }
  ssize_t n = 0;
  if (!value.empty()) {
    do n = ::write(fd, value.data(), value.size());
    while (n < 0 && errno == EINTR);
  }
  const int err = errno;
  ::close(fd);
  if (n < 0) {
    return Fail(ErrorCode::kIo,
                fmt::format("{}: writing '{}' failed: {}", path, value, Errno(err)));
  }
  return {};
}

Result<BufferSizeKb> ParseBufferSizeKb(std::string_view content) {
  std::string_view t = content;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.remove_suffix(1);
  BufferSizeKb out;
  if (t == "X") {
    out.mixed = true;
    return out;
  }
  std::string_view kb = t;
  constexpr std::string_view kExpanded = " (expanded: ";
  if (const size_t at = t.find(kExpanded); at != std::string_view::npos) {
    kb = t.substr(0, at);
    std::string_view rest = t.substr(at + kExpanded.size());
    if (rest.ends_with(')')) out.expanded_kb = ParseDecimal(rest.substr(0, rest.size() - 1));
    if (!out.expanded_kb) kb = {};  // refused below
  }
  const std::optional<uint64_t> v = ParseDecimal(kb);
  if (!v) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("buffer_size_kb '{}': expected KB, 'KB (expanded: KB)' or 'X'", t));
  }
  out.kb = *v;
  return out;
}

bool SameBufferSize(std::string_view saved, std::string_view now, uint64_t page_data_bytes) {
  auto a = ParseBufferSizeKb(saved), b = ParseBufferSizeKb(now);
  if (!a || !b) return saved == now;
  if (a->mixed || b->mixed) return a->mixed && b->mixed;
  if (a->expanded_kb && !b->expanded_kb && page_data_bytes > 0)
    return PagesFor(*a->expanded_kb, page_data_bytes) == PagesFor(b->kb, page_data_bytes);
  return a->kb == b->kb && a->expanded_kb == b->expanded_kb;
}

Result<std::string> FindTracefs(const std::string& dir_arg, bool mount_if_missing) {
  std::string dir = dir_arg;
  std::string origin;
  if (dir.empty()) {
    if (const char* env = std::getenv("EXITSCOPE_TRACEFS"); env && *env) {
      dir = env;
      origin = " (from EXITSCOPE_TRACEFS)";
    }
  }
  if (!dir.empty()) {
    if (!Exists(dir)) {
      return Fail(ErrorCode::kUnavailable,
                  fmt::format("tracefs not found at {}{}: point EXITSCOPE_TRACEFS at a mounted "
                              "tracefs, or mount one with `mount -t tracefs nodev {}` as root",
                              dir, origin, dir));
    }
  } else {
    dir = "/sys/kernel/tracing";
    struct statfs sfs;
    const bool mounted = ::statfs(dir.c_str(), &sfs) == 0 && sfs.f_type == kTracefsMagic;
    if (!mounted) {
      int err = ENOENT;
      if (IsDir(dir) && mount_if_missing) {
        if (::mount("nodev", dir.c_str(), "tracefs", 0, nullptr) == 0) return dir;
        err = errno;
      }
      if (Exists("/sys/kernel/debug/tracing/tracing_on")) return "/sys/kernel/debug/tracing";
      return Fail(err == EPERM || err == EACCES ? ErrorCode::kPermission : ErrorCode::kUnavailable,
                  fmt::format("tracefs not mounted at {} ({}): run `mount -t tracefs nodev {}` "
                              "as root",
                              dir, Errno(err), dir));
    }
  }
  const std::string probe = dir + "/tracing_on";
  if (::access(probe.c_str(), R_OK | W_OK) != 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM || err == EROFS) {
      return Fail(ErrorCode::kPermission,
                  fmt::format("tracefs at {}{} is not writable for uid {} ({}): run as root "
                              "(e.g. `sudo exitscope kvm ...`)",
                              dir, origin, ::getuid(), Errno(err)));
    }
    return Fail(ErrorCode::kUnavailable,
                fmt::format("{}{} is not a tracefs mount (no tracing_on: {}): point "
                            "EXITSCOPE_TRACEFS at tracefs or run `mount -t tracefs nodev "
                            "/sys/kernel/tracing` as root",
                            dir, origin, Errno(err)));
  }
  return dir;
}

// ---------------------------------------------------------------------------------------------
// TracefsSettings

Result<TracefsSettings> TracefsSettings::Capture(const std::string& buffer_dir,
                                                 const std::vector<std::string>& systems) {
  TracefsSettings s;
  s.dir_ = buffer_dir;
  std::vector<std::string> rels = {"tracing_on",    "trace_clock",        "buffer_size_kb",
                                   "set_event_pid", "options/event-fork", "set_event",
                                   "current_tracer"};
  for (const std::string& cpu : ListDir(buffer_dir + "/per_cpu", true))
    rels.push_back("per_cpu/" + cpu + "/buffer_size_kb");
  for (const std::string& sys : systems) {
    rels.push_back("events/" + sys + "/enable");
    for (const std::string& ev : ListDir(buffer_dir + "/events/" + sys, true)) {
      rels.push_back("events/" + sys + "/" + ev + "/enable");
      rels.push_back("events/" + sys + "/" + ev + "/filter");
    }
  }
  for (const std::string& rel : rels) {
    const std::string path = buffer_dir + "/" + rel;
    if (!Exists(path)) continue;
    auto content = ReadTracefsFile(path);
    if (!content) return Propagate(content);
    s.files_.emplace_back(rel, std::move(*content));
  }
  // Page geometry, to compare an unexpanded size with the size the kernel expands it to.
  uint64_t data_bytes = 0;
  if (auto hp = ReadTracefsFile(buffer_dir + "/events/header_page")) {
    data_bytes = HeaderPageDataBytes(*hp);
  }
  if (data_bytes == 0) {
    uint64_t subbuf = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    if (auto kb = ReadTracefsFile(buffer_dir + "/buffer_subbuf_size_kb"))
      if (auto v = ParseDecimal(Trim(*kb)); v && *v > 0) subbuf = *v * 1024;
    data_bytes = subbuf - 16;  // the page header: u64 timestamp, local_t commit
  }
  s.page_data_bytes_ = data_bytes;
  return s;
}

const std::string* TracefsSettings::Find(const std::string& rel) const {
  for (const auto& f : files_)
    if (f.first == rel) return &f.second;
  return nullptr;
}

Status TracefsSettings::Restore() const {
  std::vector<const std::pair<std::string, std::string>*> order;
  for (const auto& f : files_)
    if (RestoreRank(f.first) >= 0) order.push_back(&f);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return RestoreRank(a->first) < RestoreRank(b->first);
  });
  // An unexpanded buffer: the total is restored to the expanded size on every CPU, and the
  // per-CPU files, which read the 7 KiB placeholder, are left alone (writing "7" there is
  // what shrank the host's buffer).
  const std::string* total = Find("buffer_size_kb");
  const auto total_size = total ? ParseBufferSizeKb(*total) : Result<BufferSizeKb>(BufferSizeKb{});
  const bool unexpanded = total_size && total_size->expanded_kb.has_value();
  Status first_error;
  for (const auto* f : order) {
    const std::string path = dir_ + "/" + f->first;
    // "X": per-CPU sizes differ; they are restored one by one.
    if (f->first == "buffer_size_kb" && total_size && total_size->mixed) continue;
    if (unexpanded && f->first.starts_with("per_cpu/")) continue;
    auto now = ReadTracefsFile(path);
    // Read again at its turn: per-CPU sizes follow the total once that is restored.
    if (now && *now == f->second) continue;
    if (now && IsBufferSizeFile(f->first) && SameBufferSize(f->second, *now, page_data_bytes_))
      continue;
    Status st = WriteTracefsFile(path, RestoreValue(f->first, f->second));
    if (!st && first_error) first_error = st;
  }
  return first_error;
}

std::vector<std::string> TracefsSettings::Diff(const TracefsSettings& other) const {
  std::vector<std::string> out;
  // The expanded size an unexpanded buffer promised, for its per-CPU placeholder sizes.
  std::optional<uint64_t> promised;
  if (const std::string* total = Find("buffer_size_kb"))
    if (auto size = ParseBufferSizeKb(*total); size) promised = size->expanded_kb;
  for (const auto& [rel, content] : files_) {
    auto it = std::find_if(other.files_.begin(), other.files_.end(),
                           [&](const auto& f) { return f.first == rel; });
    if (it == other.files_.end()) {
      out.push_back(fmt::format("{}: missing in the other snapshot", rel));
    } else if (it->second == content) {
      continue;
    } else if (IsBufferSizeFile(rel)) {
      std::string saved = content;
      if (promised && rel != "buffer_size_kb")
        saved = fmt::format("{} (expanded: {})", Trim(content), *promised);
      if (!SameBufferSize(saved, it->second, page_data_bytes_))
        out.push_back(fmt::format("{}: '{}' -> '{}'", rel, Trim(content), Trim(it->second)));
    } else {
      out.push_back(fmt::format("{}: '{}' -> '{}'", rel, Trim(content), Trim(it->second)));
    }
  }
  for (const auto& [rel, content] : other.files_) {
    if (std::none_of(files_.begin(), files_.end(), [&](const auto& f) { return f.first == rel; }))
      out.push_back(fmt::format("{}: new in the other snapshot", rel));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// TracefsSession

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

// ---------------------------------------------------------------------------------------------
// StopSignalScope

namespace {
std::atomic<int> g_stop_signal{0};
constexpr int kStopSignals[3] = {SIGINT, SIGTERM, SIGHUP};
// C++ linkage on purpose: an extern "C" handler name is global and clashes with others'.
void OnTracefsStopSignal(int sig) {
  g_stop_signal.store(sig, std::memory_order_relaxed);
}
}  // namespace

StopSignalScope::StopSignalScope() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = OnTracefsStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: sleeps and reads return EINTR
  for (int i = 0; i < 3; ++i) ::sigaction(kStopSignals[i], &sa, &old_[i]);
}

StopSignalScope::~StopSignalScope() {
  for (int i = 0; i < 3; ++i) ::sigaction(kStopSignals[i], &old_[i], nullptr);
}

bool StopSignalScope::StopRequested() noexcept {
  return g_stop_signal.load(std::memory_order_relaxed) != 0;
}
int StopSignalScope::LastSignal() noexcept {
  return g_stop_signal.load(std::memory_order_relaxed);
}
void StopSignalScope::Reset() noexcept {
  g_stop_signal.store(0, std::memory_order_relaxed);
}

}  // namespace exitscope::sources
