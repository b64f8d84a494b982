// sources/tracefs_dat.cc: see tracefs_dat.h.
#include "sources/tracefs_dat.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/text.h"
#include "fmt/format.h"
#include "sources/tracefs_session.h"

namespace exitscope::sources {
namespace {

// Option ids of trace-cmd's file format (trace-cmd-private.h).
constexpr uint16_t kOptionDone = 0;
constexpr uint16_t kOptionCpuStat = 2;
constexpr uint16_t kOptionTraceClock = 4;
constexpr uint16_t kOptionUname = 5;

template <typename T>
void Put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

std::vector<std::string> SubDirs(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = ::opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    struct stat st;
    if (::stat((path + "/" + e->d_name).c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      out.emplace_back(e->d_name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// Format files of every event of a system that has one.
Result<std::vector<std::string>> SystemFormats(const std::string& tracefs, const std::string& sys) {
  std::vector<std::string> out;
  for (const std::string& ev : SubDirs(tracefs + "/events/" + sys)) {
    const std::string path = tracefs + "/events/" + sys + "/" + ev + "/format";
    if (::access(path.c_str(), R_OK) != 0) continue;
    auto f = ReadTracefsFile(path);
    if (!f) return Propagate(f);
    out.push_back(std::move(*f));
  }
  return out;
}

Status WriteAll(int fd, const void* data, size_t len, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Fail(ErrorCode::kIo, fmt::format("{}: write failed: {}", path, std::strerror(errno)));
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return {};
}

// The cumulative counters of per_cpu/cpuN/stats ("overrun: 12") minus those of `base`, so
// the stats describe one recording even in a buffer that was read before.
std::string StatsSince(const std::string& now, const std::string& base) {
  static constexpr const char* kCumulative[] = {"overrun", "commit overrun", "dropped events",
                                                "read events"};
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    base::LineSplitter split(text);
    for (std::string_view line; split.Next(&line);) out.emplace_back(line);
    return out;
  };
  const std::vector<std::string> old_lines = lines(base);
  std::string out;
  for (std::string line : lines(now)) {
    for (const char* key : kCumulative) {
      const std::string prefix = std::string(key) + ": ";
      if (line.rfind(prefix, 0) != 0) continue;
      for (const std::string& old : old_lines) {
        if (old.rfind(prefix, 0) != 0) continue;
        const uint64_t cur = std::strtoull(line.c_str() + prefix.size(), nullptr, 10);
        const uint64_t was = std::strtoull(old.c_str() + prefix.size(), nullptr, 10);
        line = prefix + std::to_string(cur >= was ? cur - was : cur);
      }
    }
    out += line;
    out += '\n';
  }
  return out;
}

int OpenTemp(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  std::string tmpl = dir + "/.exitscope-record-XXXXXX";
  fd = ::mkstemp(tmpl.data());
  if (fd >= 0) ::unlink(tmpl.c_str());
  return fd;
}

}  // namespace

Result<std::unique_ptr<TraceDatWriter>> TraceDatWriter::Create(const std::string& path,
                                                               const TracefsSession& s) {
  return Create(
      path, Layout{s.tracefs_dir(), s.buffer_dir(), s.systems(), s.cpu_count(), s.subbuf_size()});
}

Result<std::unique_ptr<TraceDatWriter>> TraceDatWriter::Create(const std::string& path,
                                                               const Layout& layout) {
  if (layout.cpus <= 0 || layout.page_size < 64 || !std::has_single_bit(layout.page_size)) {
    return Fail(ErrorCode::kInvalidArgument, fmt::format("{}: bad trace layout", path));
  }
  std::unique_ptr<TraceDatWriter> w(new TraceDatWriter());
  w->path_ = path;
  w->layout_ = layout;

  // Event formats first: a tracefs problem should not leave an empty output behind.
  std::string& h = w->header_;
  h.append("\x17\x08\x44tracing", 10);
  h.append("6", 2);  // with its NUL
  h.push_back(std::endian::native == std::endian::big ? 1 : 0);
  h.push_back(static_cast<char>(sizeof(long)));
  Put<uint32_t>(h, static_cast<uint32_t>(layout.page_size));
  for (const char* name : {"header_page", "header_event"}) {
    auto text = ReadTracefsFile(layout.tracefs_dir + "/events/" + name);
    if (!text) return Propagate(text);
    h.append(name, std::strlen(name) + 1);
    Put<uint64_t>(h, text->size());
    h += *text;
  }
  auto ftrace = SystemFormats(layout.tracefs_dir, "ftrace");
  if (!ftrace) return Propagate(ftrace);
  Put<uint32_t>(h, static_cast<uint32_t>(ftrace->size()));
  for (const std::string& f : *ftrace) {
    Put<uint64_t>(h, f.size());
    h += f;
  }
  std::vector<std::string> systems;
  for (const std::string& s : layout.systems)
    if (s != "ftrace") systems.push_back(s);
  Put<uint32_t>(h, static_cast<uint32_t>(systems.size()));
  for (const std::string& sys : systems) {
    auto formats = SystemFormats(layout.tracefs_dir, sys);
    if (!formats) return Propagate(formats);
    h.append(sys.c_str(), sys.size() + 1);
    Put<uint32_t>(h, static_cast<uint32_t>(formats->size()));
    for (const std::string& f : *formats) {
      Put<uint64_t>(h, f.size());
      h += f;
    }
  }
  Put<uint32_t>(h, 0);  // kallsyms: not needed to decode kvm events
  auto printk = ReadTracefsFile(layout.tracefs_dir + "/printk_formats");
  const std::string printk_text = printk ? *printk : std::string();
  Put<uint32_t>(h, static_cast<uint32_t>(printk_text.size()));
  h += printk_text;

  // The one output rule (base/output_file.h): the .dat appears whole at Finish, or not at all.
  if (Status st = w->out_.Open(path, {.what = "a recording", .allow_stdout = false}); !st) {
    return Propagate(st);
  }
  std::string dir = ".";
  if (const size_t slash = path.rfind('/'); slash != std::string::npos)
    dir = slash == 0 ? "/" : path.substr(0, slash);
  for (int cpu = 0; cpu < layout.cpus; ++cpu) {
    const int fd = OpenTemp(dir);
    if (fd < 0) {
      return Fail(ErrorCode::kIo,
                  fmt::format("{}: cannot create a temporary file: {}", dir, std::strerror(errno)));
    }
    w->cpu_fds_.push_back(fd);
  }
  w->cpu_pages_.assign(static_cast<size_t>(layout.cpus), 0);
  for (int cpu = 0; cpu < layout.cpus && !layout.buffer_dir.empty(); ++cpu) {
    auto stats = ReadTracefsFile(fmt::format("{}/per_cpu/cpu{}/stats", layout.buffer_dir, cpu));
    w->baseline_stats_.push_back(stats ? *stats : std::string());
  }
  return w;
}

TraceDatWriter::~TraceDatWriter() {
  for (int fd : cpu_fds_)
    if (fd >= 0) ::close(fd);
}

uint64_t TraceDatWriter::pages() const {
  uint64_t n = 0;
  for (uint64_t p : cpu_pages_) n += p;
  return n;
}

Status TraceDatWriter::AddPage(int cpu, const uint8_t* page, size_t size) {
  if (cpu < 0 || cpu >= layout_.cpus || size != layout_.page_size) {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: page of {} bytes for CPU {} does not fit the layout ({} CPUs, "
                            "{}-byte pages)",
                            path_, size, cpu, layout_.cpus, layout_.page_size));
  }
  if (Status st = WriteAll(cpu_fds_[static_cast<size_t>(cpu)], page, size, path_); !st) return st;
  ++cpu_pages_[static_cast<size_t>(cpu)];
  return {};
}

Status TraceDatWriter::Finish(const std::string& buffer_dir) {
  if (finished_ || out_.fd() < 0) {
    return Fail(ErrorCode::kInternal, fmt::format("{}: already finished", path_));
  }
  std::string h = header_;
  auto cmdlines = ReadTracefsFile(layout_.tracefs_dir + "/saved_cmdlines");
  const std::string cmd_text = cmdlines ? *cmdlines : std::string();
  Put<uint64_t>(h, cmd_text.size());
  h += cmd_text;
  Put<uint32_t>(h, static_cast<uint32_t>(layout_.cpus));

  auto clock_file = ReadTracefsFile(buffer_dir + "/trace_clock");
  if (!clock_file) return Propagate(clock_file);
  h.append("options  ", 10);
  const std::string clock_opt = *clock_file + '\0';
  Put<uint16_t>(h, kOptionTraceClock);
  Put<uint32_t>(h, static_cast<uint32_t>(clock_opt.size()));
  h += clock_opt;
  for (int cpu = 0; cpu < layout_.cpus; ++cpu) {
    auto stats = ReadTracefsFile(fmt::format("{}/per_cpu/cpu{}/stats", buffer_dir, cpu));
    if (!stats) continue;
    const std::string since = static_cast<size_t>(cpu) < baseline_stats_.size()
                                  ? StatsSince(*stats, baseline_stats_[static_cast<size_t>(cpu)])
                                  : *stats;
    const std::string text = fmt::format("CPU: {}\n{}", cpu, since) + '\0';
    Put<uint16_t>(h, kOptionCpuStat);
    Put<uint32_t>(h, static_cast<uint32_t>(text.size()));
    h += text;
  }
  struct utsname u;
  if (::uname(&u) == 0) {
    const std::string text =
        fmt::format("{} {} {} {}", u.sysname, u.nodename, u.release, u.machine) + '\0';
    Put<uint16_t>(h, kOptionUname);
    Put<uint32_t>(h, static_cast<uint32_t>(text.size()));
    h += text;
  }
  Put<uint16_t>(h, kOptionDone);

  h.append("flyrecord", 10);
  const size_t table_at = h.size();
  for (int cpu = 0; cpu < layout_.cpus; ++cpu) {
    Put<uint64_t>(h, 0);
    Put<uint64_t>(h, 0);
  }
  Put<uint64_t>(h, clock_file->size());
  h += *clock_file;
  const size_t page = layout_.page_size;
  uint64_t offset = (h.size() + page - 1) / page * page;
  for (int cpu = 0; cpu < layout_.cpus; ++cpu) {
    const uint64_t size = cpu_pages_[static_cast<size_t>(cpu)] * page;
    std::memcpy(h.data() + table_at + static_cast<size_t>(cpu) * 16, &offset, 8);
    std::memcpy(h.data() + table_at + static_cast<size_t>(cpu) * 16 + 8, &size, 8);
    offset += size;
  }
  h.resize((h.size() + page - 1) / page * page, '\0');
  if (Status st = out_.Write(h); !st) return st;
  bytes_written_ = h.size();

  std::vector<char> buf(1 << 20);
  for (int cpu = 0; cpu < layout_.cpus; ++cpu) {
    const int fd = cpu_fds_[static_cast<size_t>(cpu)];
    if (::lseek(fd, 0, SEEK_SET) < 0) {
      return Fail(ErrorCode::kIo,
                  fmt::format("{}: temporary data: {}", path_, std::strerror(errno)));
    }
    for (;;) {
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return Fail(ErrorCode::kIo,
                    fmt::format("{}: temporary data: {}", path_, std::strerror(errno)));
      }
      if (n == 0) break;
      if (Status st = out_.Write({buf.data(), static_cast<size_t>(n)}); !st) return st;
      bytes_written_ += static_cast<uint64_t>(n);
    }
  }
  if (Status st = out_.Commit(); !st) return st;
  finished_ = true;
  return {};
}

}  // namespace exitscope::sources
