#include "sources/tracecmd_dat.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <traceevent/event-parse.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "sources/kvm_trace.h"

// libtracecmd's API, declared here because <trace-cmd/trace-cmd.h> includes <tracefs.h>,
// whose inline tracefs_hist_start() does not compile as C++ (int -> enum). Signatures as in
// libtracecmd 1.3 (trace-cmd.h); the last three are exported but declared only in its
// private header (trace-cmd-private.h).
extern "C" {
struct tracecmd_input;
struct tracecmd_input* tracecmd_open(const char* file, int flags);
void tracecmd_close(struct tracecmd_input* handle);
struct tep_handle* tracecmd_get_tep(struct tracecmd_input* handle);
int tracecmd_iterate_events(struct tracecmd_input* handle, cpu_set_t* cpus, int cpu_size,
                            int (*callback)(struct tracecmd_input* handle,
                                            struct tep_record*, int, void*),
                            void* callback_data);
void tracecmd_set_loglevel(enum tep_loglevel level);
const char* tracecmd_get_trace_clock(struct tracecmd_input* handle);
const char* tracecmd_get_cpustats(struct tracecmd_input* handle);
int tracecmd_cpus(struct tracecmd_input* handle);
}

namespace exitscope::sources {
namespace {

constexpr int kTraceCmdNoPlugins = 1 << 0;  // TRACECMD_FL_LOAD_NO_PLUGINS
constexpr std::string_view kMagic = "\x17\x08\x44tracing";

// Parses "CPU: 0\n...overrun: N\n...read events: M\n" blocks.
struct CpuStat {
  uint64_t overrun = 0;
  uint64_t read_events = 0;
  bool has_read_events = false;
};

uint64_t ParseU64(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  uint64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

std::vector<CpuStat> ParseCpuStats(std::string_view text) {
  std::vector<CpuStat> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.starts_with("CPU:")) {
      out.emplace_back();
    } else if (!out.empty() && line.starts_with("overrun:")) {
      out.back().overrun = ParseU64(line.substr(8));
    } else if (!out.empty() && line.starts_with("read events:")) {
      out.back().read_events = ParseU64(line.substr(12));
      out.back().has_read_events = true;
    }
  }
  return out;
}

struct IterState {
  KvmTepDecoder* decoder;
  KvmPairer* pairer;
  KvmRecord rec;
  uint64_t read = 0;
  std::vector<uint64_t> per_cpu;
  std::vector<uint64_t> last_offset;
};

int OnRecord(tracecmd_input*, tep_record* record, int cpu, void* data) {
  auto* st = static_cast<IterState*>(data);
  ++st->read;
  const auto c = static_cast<uint32_t>(cpu < 0 ? 0 : cpu);
  if (c < st->per_cpu.size()) {
    ++st->per_cpu[c];
    st->last_offset[c] = record->offset;
  }
  if (record->missed_events != 0) st->pairer->OnLost(c, record->missed_events);
  if (st->decoder->Decode(record, c, &st->rec)) {
    st->pairer->Feed(st->rec);
  } else {
    KvmRecord other;
    other.type = KvmEventType::kOther;
    other.ts = record->ts;
    other.cpu = c;
    st->pairer->Feed(other);
  }
  return 0;
}

}  // namespace

bool LooksLikeTraceCmdDat(std::string_view head) noexcept { return head.starts_with(kMagic); }

Result<std::unique_ptr<TraceCmdDat>> TraceCmdDat::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  char head[32] = {};
  const ssize_t n = ::pread(fd, head, sizeof(head), 0);
  struct stat st{};
  ::fstat(fd, &st);
  ::close(fd);
  if (n < static_cast<ssize_t>(kMagic.size()) + 2) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: offset {}: file ends inside the trace-cmd header", path,
                            n < 0 ? 0 : n));
  }
  if (!LooksLikeTraceCmdDat(std::string_view(head, static_cast<size_t>(n)))) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: offset 0: not a trace-cmd .dat file (bad magic)", path));
  }
  const char version = head[kMagic.size()];
  if (version < '6' || version > '7' || head[kMagic.size() + 1] != '\0') {
    return Fail(ErrorCode::kUnsupported,
                fmt::format("{}: offset {}: unsupported trace-cmd file version '{}' (6 and 7 "
                            "are read)",
                            path, kMagic.size(), std::string_view(&head[kMagic.size()], 1)));
  }

  tracecmd_set_loglevel(TEP_LOG_NONE);
  tracecmd_input* h = tracecmd_open(path.c_str(), kTraceCmdNoPlugins);
  if (h == nullptr) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: offset {}: truncated or corrupt trace-cmd file (version {}): "
                            "libtracecmd cannot read its headers, sections or CPU data",
                            path, static_cast<uint64_t>(st.st_size), version));
  }
  std::unique_ptr<TraceCmdDat> dat(new TraceCmdDat());
  dat->path_ = path;
  dat->handle_ = h;
  if (const char* clock = tracecmd_get_trace_clock(h); clock != nullptr && *clock != '\0') {
    dat->clock_ = clock;
  }
  dat->cpus_ = tracecmd_cpus(h);
  if (const char* stats = tracecmd_get_cpustats(h); stats != nullptr) {
    for (const CpuStat& cs : ParseCpuStats(stats)) dat->lost_at_record_ += cs.overrun;
  }
  return dat;
}

TraceCmdDat::~TraceCmdDat() {
  if (handle_ != nullptr) tracecmd_close(handle_);
}

Status TraceCmdDat::ReadAll(KvmPairer* pairer) {
  KvmTepDecoder decoder(tracecmd_get_tep(handle_));
  IterState st{&decoder, pairer, {}, 0, {}, {}};
  const size_t ncpu = static_cast<size_t>(cpus_ > 0 ? cpus_ : 0);
  st.per_cpu.assign(ncpu, 0);
  st.last_offset.assign(ncpu, 0);
  const int rc = tracecmd_iterate_events(handle_, nullptr, 0, OnRecord, &st);
  pairer->Finish();
  records_read_ = st.read;
  if (rc < 0) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: error reading CPU data after {} records", path_, st.read));
  }
  // A capture whose CPU data is cut short reads fewer records than the kernel handed to
  // trace-cmd (CPUSTAT "read events"): report where the data stops.
  if (const char* text = tracecmd_get_cpustats(handle_); text != nullptr) {
    const std::vector<CpuStat> stats = ParseCpuStats(text);
    for (size_t c = 0; c < stats.size() && c < ncpu; ++c) {
      if (stats[c].has_read_events && st.per_cpu[c] < stats[c].read_events) {
        return Fail(ErrorCode::kCorrupt,
                    fmt::format("{}: offset {}: CPU {} data ends after {} of {} records "
                                "(truncated or corrupt file)",
                                path_, st.last_offset[c], c, st.per_cpu[c],
                                stats[c].read_events));
      }
    }
  }
  if (decoder.short_records() != 0) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: {} kvm records shorter than their event format (corrupt "
                            "CPU data)",
                            path_, decoder.short_records()));
  }
  return {};
}

ClockScale ScaleForClock(std::string_view clock, uint64_t tsc_khz) {
  if (clock == "x86-tsc" || clock == "counter" || clock == "tsc") {
    if (tsc_khz == 0) tsc_khz = HostTscKhz();
    if (tsc_khz == 0) return {};
    return ClockScale::FromTscKhz(tsc_khz);
  }
  return {};
}

uint64_t HostTscKhz() {
  {
    std::ifstream f("/sys/devices/system/cpu/cpu0/tsc_freq_khz");
    uint64_t khz = 0;
    if (f >> khz && khz > 0) return khz;
  }
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.starts_with("cpu MHz")) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      double mhz = 0;
      std::string_view v(line);
      v.remove_prefix(colon + 1);
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      std::from_chars(v.data(), v.data() + v.size(), mhz);
      if (mhz > 0) return static_cast<uint64_t>(mhz * 1000.0 + 0.5);
    }
  }
  return 0;
}

}  // namespace exitscope::sources
