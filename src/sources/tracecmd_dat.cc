#include "sources/tracecmd_dat.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <traceevent/event-parse.h>
extern "C" {
#include <traceevent/kbuffer.h>  // no extern "C" of its own
}
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
                            int (*callback)(struct tracecmd_input* handle, struct tep_record*, int,
                                            void*),
                            void* callback_data);
void tracecmd_set_loglevel(enum tep_loglevel level);
struct tep_record* tracecmd_read_cpu_first(struct tracecmd_input* handle, int cpu);
void tracecmd_free_record(struct tep_record* record);
int tracecmd_page_size(struct tracecmd_input* handle);
unsigned long long tracecmd_get_cpu_file_size(struct tracecmd_input* handle, int cpu);
void tracecmd_set_all_cpus_to_timestamp(struct tracecmd_input* handle, unsigned long long time);
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

// Walks a version 6 file's sections (trace-cmd.dat.v6(5)) up to the flyrecord CPU table and
// checks every CPU's data lies inside the file, so a truncated or corrupt file is refused
// with the offset where it breaks instead of being handed to libtracecmd (which crashes on
// some of them: tracecmd_open on a v6 file cut inside its CPU data).
class V6Walker {
 public:
  V6Walker(std::string_view data, std::string path) : d_(data), path_(std::move(path)) {}

  Status Walk() {
    pos_ = kMagic.size();
    const size_t nul = d_.find('\0', pos_);
    if (nul == std::string_view::npos) return Cut("version string");
    pos_ = nul + 1;
    uint64_t endian = 0, long_size = 0, page = 0;
    if (!Num(1, &endian, "endianness") || !Num(1, &long_size, "long size") ||
        !Num(4, &page, "page size")) {
      return err_;
    }
    big_ = endian != 0;
    for (std::string_view tag :
         {std::string_view("header_page"), std::string_view("header_event")}) {
      if (!Tag(tag)) return err_;
      if (!Blob(8, tag)) return err_;
    }
    uint64_t n = 0;
    if (!Num(4, &n, "ftrace format count")) return err_;
    for (uint64_t i = 0; i < n; ++i) {
      if (!Blob(8, "ftrace event format")) return err_;
    }
    uint64_t systems = 0;
    if (!Num(4, &systems, "event system count")) return err_;
    for (uint64_t s = 0; s < systems; ++s) {
      const size_t end = d_.find('\0', pos_);
      if (end == std::string_view::npos) return Cut("event system name");
      pos_ = end + 1;
      if (!Num(4, &n, "event count")) return err_;
      for (uint64_t i = 0; i < n; ++i) {
        if (!Blob(8, "event format")) return err_;
      }
    }
    if (!Blob(4, "kallsyms") || !Blob(4, "printk formats") || !Blob(8, "saved cmdlines")) {
      return err_;
    }
    uint64_t cpus = 0;
    if (!Num(4, &cpus, "CPU count")) return err_;
    for (;;) {  // "options  \0" blocks, then "flyrecord\0" or "latency  \0"
      if (pos_ + 10 > d_.size()) return Cut("section tag");
      const std::string_view tag = d_.substr(pos_, 10);
      if (tag == std::string_view("options  \0", 10)) {
        pos_ += 10;
        for (;;) {
          uint64_t id = 0;
          if (!Num(2, &id, "option id")) return err_;
          if (id == 0) break;
          if (!Blob(4, "option")) return err_;
        }
        continue;
      }
      if (tag == std::string_view("latency  \0", 10)) return {};
      if (tag != std::string_view("flyrecord\0", 10)) {
        return Fail(
            ErrorCode::kCorrupt,
            fmt::format("{}: offset {}: expected options or flyrecord section", path_, pos_));
      }
      pos_ += 10;
      break;
    }
    for (uint64_t c = 0; c < cpus; ++c) {
      uint64_t off = 0, size = 0;
      if (!Num(8, &off, "CPU data offset") || !Num(8, &size, "CPU data size")) return err_;
      if (off > d_.size() || size > d_.size() - off) {
        return Fail(ErrorCode::kCorrupt,
                    fmt::format("{}: offset {}: CPU {} data [{}, {}) extends past the end of "
                                "the file (truncated)",
                                path_, d_.size(), c, off, off + size));
      }
    }
    return {};
  }

 private:
  Status Cut(std::string_view what) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: offset {}: file ends inside the {} (truncated)", path_,
                            std::min(pos_, d_.size()), what));
  }
  bool Num(int bytes, uint64_t* v, std::string_view what) {
    if (pos_ + static_cast<size_t>(bytes) > d_.size()) {
      err_ = Cut(what);
      return false;
    }
    uint64_t x = 0;
    for (int i = 0; i < bytes; ++i) {
      const uint64_t b = static_cast<uint8_t>(d_[pos_ + static_cast<size_t>(i)]);
      x |= big_ ? b << (8 * (bytes - 1 - i)) : b << (8 * i);
    }
    pos_ += static_cast<size_t>(bytes);
    *v = x;
    return true;
  }
  bool Tag(std::string_view tag) {
    if (d_.substr(pos_, tag.size() + 1) != std::string(tag) + '\0') {
      err_ = pos_ + tag.size() + 1 > d_.size()
                 ? Cut(tag)
                 : Status(Fail(ErrorCode::kCorrupt,
                               fmt::format("{}: offset {}: expected \"{}\"", path_, pos_, tag)));
      return false;
    }
    pos_ += tag.size() + 1;
    return true;
  }
  bool Blob(int len_bytes, std::string_view what) {
    uint64_t len = 0;
    if (!Num(len_bytes, &len, what)) return false;
    if (len > d_.size() - pos_) {
      err_ = Cut(what);
      return false;
    }
    pos_ += len;
    return true;
  }

  std::string_view d_;
  std::string path_;
  size_t pos_ = 0;
  bool big_ = false;
  Status err_;
};

}  // namespace

bool LooksLikeTraceCmdDat(std::string_view head) noexcept {
  return head.starts_with(kMagic);
}

Result<std::unique_ptr<TraceCmdDat>> TraceCmdDat::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  char head[32] = {};
  const ssize_t n = ::pread(fd, head, sizeof(head), 0);
  struct stat st {};
  ::fstat(fd, &st);
  ::close(fd);
  if (n < static_cast<ssize_t>(kMagic.size()) + 2) {
    return Fail(
        ErrorCode::kCorrupt,
        fmt::format("{}: offset {}: file ends inside the trace-cmd header", path, n < 0 ? 0 : n));
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

  if (version == '6') {
    const int vfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (vfd >= 0 && st.st_size > 0) {
      void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, vfd, 0);
      ::close(vfd);
      if (m != MAP_FAILED) {
        const Status walked =
            V6Walker(std::string_view(static_cast<const char*>(m), static_cast<size_t>(st.st_size)),
                     path)
                .Walk();
        ::munmap(m, static_cast<size_t>(st.st_size));
        if (!walked) return std::unexpected(walked.error());
      }
    } else if (vfd >= 0) {
      ::close(vfd);
    }
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

// The fast path: the CPU data is read straight from the mapped file with kbuffer, merged by
// timestamp across CPUs, with no record allocated per event (libtracecmd allocates and frees
// one per record). Used only when it provably reads what libtracecmd reads: uncompressed,
// page-aligned CPU sections whose first record has the same timestamp and bytes as
// tracecmd_read_cpu_first() gives (no timestamp offsets or conversions applied by
// libtracecmd). Returns false, having fed nothing, when that does not hold.
bool TraceCmdDat::ReadMapped(KvmPairer* pairer, KvmTepDecoder* decoder, Status* status) {
  const int page = tracecmd_page_size(handle_);
  if (page <= 0 || cpus_ <= 0) return false;
  struct Cpu {
    uint64_t begin = 0, end = 0, next_page = 0;
    kbuffer* kbuf = nullptr;
    void* data = nullptr;  // current event, null when the CPU is done
    unsigned long long ts = 0;
    uint64_t count = 0, last_offset = 0;
  };
  std::vector<Cpu> cpu(static_cast<size_t>(cpus_));
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  ::fstat(fd, &st);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  void* map = file_size ? ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (map == MAP_FAILED) return false;
  const auto* base = static_cast<const uint8_t*>(map);
  bool ok = true;
  const auto cleanup = [&] {
    for (Cpu& c : cpu) {
      if (c.kbuf) kbuffer_free(c.kbuf);
    }
    ::munmap(map, file_size);
  };
  // Locate and validate each CPU's pages.
  for (int i = 0; i < cpus_ && ok; ++i) {
    Cpu& c = cpu[static_cast<size_t>(i)];
    tep_record* first = tracecmd_read_cpu_first(handle_, i);
    if (first == nullptr) continue;  // no data for this CPU
    const uint64_t size = tracecmd_get_cpu_file_size(handle_, i);
    c.begin = first->offset & ~static_cast<uint64_t>(page - 1);
    c.end = c.begin + size;
    if (size == 0 || size % static_cast<uint64_t>(page) != 0 || c.end > file_size) {
      if (c.end > file_size && size % static_cast<uint64_t>(page) == 0) {
        *status = Fail(ErrorCode::kCorrupt,
                       fmt::format("{}: offset {}: CPU {} data needs {} bytes up to offset {} "
                                   "(truncated file)",
                                   path_, file_size, i, size, c.end));
      }
      tracecmd_free_record(first);
      ok = false;
      break;
    }
    c.kbuf = kbuffer_alloc(KBUFFER_LSIZE_8, tep_is_file_bigendian(tracecmd_get_tep(handle_))
                                                ? KBUFFER_ENDIAN_BIG
                                                : KBUFFER_ENDIAN_LITTLE);
    c.next_page = c.begin;
    // First event of the first non-empty page must be libtracecmd's first record.
    while (c.data == nullptr && c.next_page < c.end) {
      kbuffer_load_subbuffer(c.kbuf, const_cast<uint8_t*>(base + c.next_page));
      c.next_page += static_cast<uint64_t>(page);
      c.data = kbuffer_read_event(c.kbuf, &c.ts);
    }
    ok = c.data != nullptr && c.ts == first->ts && kbuffer_event_size(c.kbuf) == first->size &&
         std::memcmp(c.data, first->data, static_cast<size_t>(first->size)) == 0;
    tracecmd_free_record(first);
  }
  if (!ok) {
    cleanup();
    return false;
  }
  // Reset each CPU to its first page and account for losses reported on it.
  for (size_t i = 0; i < cpu.size(); ++i) {
    Cpu& c = cpu[i];
    if (c.kbuf == nullptr) continue;
    c.next_page = c.begin;
    c.data = nullptr;
  }
  const auto advance_page = [&](Cpu& c, uint32_t idx) {
    while (c.data == nullptr && c.next_page < c.end) {
      kbuffer_load_subbuffer(c.kbuf, const_cast<uint8_t*>(base + c.next_page));
      c.last_offset = c.next_page;
      c.next_page += static_cast<uint64_t>(page);
      const int missed = kbuffer_missed_events(c.kbuf);
      if (missed != 0) pairer->OnLost(idx, missed);
      c.data = kbuffer_read_event(c.kbuf, &c.ts);
    }
  };
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i].kbuf) advance_page(cpu[i], static_cast<uint32_t>(i));
  }
  KvmRecord rec;
  KvmRecord other;
  other.type = KvmEventType::kOther;
  uint64_t read = 0;
  for (;;) {
    size_t best = cpu.size();
    for (size_t i = 0; i < cpu.size(); ++i) {
      if (cpu[i].data != nullptr && (best == cpu.size() || cpu[i].ts < cpu[best].ts)) best = i;
    }
    if (best == cpu.size()) break;
    Cpu& c = cpu[best];
    tep_record r{};
    r.ts = c.ts;
    r.data = c.data;
    r.size = kbuffer_event_size(c.kbuf);
    r.cpu = static_cast<int>(best);
    ++read;
    ++c.count;
    if (decoder->Decode(&r, static_cast<uint32_t>(best), &rec)) {
      pairer->Feed(rec);
    } else {
      other.ts = c.ts;
      other.cpu = static_cast<uint32_t>(best);
      pairer->Feed(other);
    }
    c.data = kbuffer_next_event(c.kbuf, &c.ts);
    if (c.data == nullptr) advance_page(c, static_cast<uint32_t>(best));
  }
  records_read_ = read;
  per_cpu_read_.clear();
  last_offset_.clear();
  for (const Cpu& c : cpu) {
    per_cpu_read_.push_back(c.count);
    last_offset_.push_back(c.last_offset);
  }
  cleanup();
  return true;
}

Status TraceCmdDat::ReadAll(KvmPairer* pairer) {
  KvmTepDecoder decoder(tracecmd_get_tep(handle_));
  Status fast_status;
  used_mapped_ = false;
  if (allow_mapped_ && ReadMapped(pairer, &decoder, &fast_status)) {
    used_mapped_ = true;
    pairer->Finish();
    return CheckComplete(decoder, per_cpu_read_, last_offset_);
  }
  if (!fast_status) return fast_status;
  // The probe above read each CPU's first record: rewind every CPU to its start.
  tracecmd_set_all_cpus_to_timestamp(handle_, 0);
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
  return CheckComplete(decoder, st.per_cpu, st.last_offset);
}

Status TraceCmdDat::CheckComplete(const KvmTepDecoder& decoder,
                                  const std::vector<uint64_t>& per_cpu,
                                  const std::vector<uint64_t>& last_offset) const {
  // A capture whose CPU data is cut short reads fewer records than the kernel handed to
  // trace-cmd (CPUSTAT "read events"): report where the data stops.
  if (const char* text = tracecmd_get_cpustats(handle_); text != nullptr) {
    const std::vector<CpuStat> stats = ParseCpuStats(text);
    for (size_t c = 0; c < stats.size() && c < per_cpu.size(); ++c) {
      if (stats[c].has_read_events && per_cpu[c] < stats[c].read_events) {
        return Fail(ErrorCode::kCorrupt,
                    fmt::format("{}: offset {}: CPU {} data ends after {} of {} records "
                                "(truncated or corrupt file)",
                                path_, c < last_offset.size() ? last_offset[c] : 0, c, per_cpu[c],
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
