#include "sources/tracecmd_dat.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <traceevent/event-parse.h>
extern "C" {
#include <traceevent/kbuffer.h>  // no extern "C" of its own
}
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "base/clock_name.h"
#include "base/text.h"
#include "sources/host_tsc.h"
#include "sources/kvm_trace.h"
#include "sources/tracecmd_dat_layout.h"

// libtracecmd's API, declared here because <trace-cmd/trace-cmd.h> includes <tracefs.h>,
// whose inline tracefs_hist_start() does not compile as C++ (int -> enum). Signatures as in
// libtracecmd 1.3 (trace-cmd.h). Used only by the reference reader (set_mapped_reader(false)).
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
}

namespace exitscope::sources {
using namespace dat;  // the layout, its bounds and the sandbox (tracecmd_dat_layout.h)

namespace {

// Validates a ring-buffer page before kbuffer reads it: the commit fits the page and every
// event header, walked exactly as kbuffer walks them, stays inside the commit. kbuffer
// trusts both (a bad commit or length makes it read outside the page or loop).
bool PageIsSane(const uint8_t* page, uint32_t page_size, uint32_t long_size, bool big,
                std::string* why) {
  const auto rd4 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, page + at, 4);
    return big == (std::endian::native == std::endian::big) ? v : __builtin_bswap32(v);
  };
  uint64_t flags = 0;
  if (long_size == 8) {
    std::memcpy(&flags, page + 8, 8);
    if (big != (std::endian::native == std::endian::big)) flags = __builtin_bswap64(flags);
  } else {
    flags = rd4(8);
  }
  const uint32_t start = long_size == 8 ? 16 : 12;
  const uint32_t size = static_cast<uint32_t>(flags) & ((1u << 27) - 1);
  const bool stored = (flags & (1ull << 31)) && (flags & (1ull << 30));
  if (uint64_t{start} + size + (stored ? long_size : 0) > page_size) {
    *why = fmt::format("page commit {} does not fit a {}-byte page", size, page_size);
    return false;
  }
  uint32_t curr = 0;
  while (curr < size) {
    const uint32_t h = rd4(start + curr);
    const uint32_t type_len = big ? (h >> 27) & 31 : h & 31;
    uint64_t index = curr + 4;
    int64_t length = 0;
    switch (type_len) {
      case 29:  // padding
        length = static_cast<int32_t>(rd4(start + index));
        break;
      case 30:  // time extend
      case 31:  // absolute time stamp
        index += 4;
        break;
      case 0:
        length = static_cast<int64_t>(static_cast<int32_t>(rd4(start + index))) - 4;
        length = (length + 3) & ~int64_t{3};
        index += 4;
        break;
      default:
        length = type_len * 4;
        break;
    }
    const uint64_t next = index + static_cast<uint64_t>(length);
    if (length < 0 || (type_len != 29 && next > size) || next > UINT32_MAX) {
      *why = fmt::format(
          "event at page offset {} (type {}, length {}) overruns the page's {} "
          "committed bytes",
          start + curr, type_len, length, size);
      return false;
    }
    if (type_len == 29 && next >= size) break;
    curr = static_cast<uint32_t>(next);
  }
  return true;
}

// One CPU's data in one buffer, read page by page.
struct Stream {
  uint32_t cpu = 0;
  size_t buffer = 0;
  bool compressed = false;
  uint64_t pos = 0, end = 0;  // uncompressed: next page; compressed: next chunk header
  uint64_t chunks_left = 0;
  std::vector<uint8_t> chunk;  // one decompressed chunk + kPad
  size_t chunk_bytes = 0, chunk_pos = 0;
  uint64_t chunk_offset = 0;
  kbuffer* kbuf = nullptr;
  void* ev = nullptr;
  unsigned long long ts = 0;
  uint64_t count = 0, last_offset = 0;
};

struct IterState {
  KvmTepDecoder* decoder;
  KvmPairer* pairer;
  TraceCmdDat* dat;
  KvmRecord rec;
  uint64_t read = 0;
  std::vector<uint64_t> per_cpu;
  std::vector<uint64_t> last_offset;
};

}  // namespace

bool LooksLikeTraceCmdDat(std::string_view head) noexcept {
  return head.starts_with(kMagic);
}

Result<std::unique_ptr<TraceCmdDat>> TraceCmdDat::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: not a regular file (.dat files are read from regular files; "
                            "streams are not supported)",
                            path));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kMagic.size() + 2) {
    ::close(fd);
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: offset {}: file ends inside the trace-cmd header", path, size));
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) {
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot map: {}", path, std::strerror(errno)));
  }
  std::unique_ptr<TraceCmdDat> dat(new TraceCmdDat());
  dat->path_ = path;
  dat->map_ = static_cast<const uint8_t*>(m);
  dat->map_size_ = size;
  const std::string_view file(static_cast<const char*>(m), size);
  if (!LooksLikeTraceCmdDat(file)) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: offset 0: not a trace-cmd .dat file (bad magic)", path));
  }
  dat->layout_ = std::make_unique<Layout>();
  Layout& L = *dat->layout_;
  EXITSCOPE_RETURN_IF_ERROR(ParseLayout(file, path, &L));
  EXITSCOPE_RETURN_IF_ERROR(ProbeFormatsInChild(L, path, size));
  std::vector<FormatFailure> failures;
  dat->tep_ = BuildTep(L, nullptr, &failures);
  if (dat->tep_ == nullptr) {
    return Fail(ErrorCode::kInternal, fmt::format("{}: cannot allocate a tep handle", path));
  }
  // Formats of other systems that do not parse leave their events undefined (their records
  // are counted as "unknown"), as in trace-cmd report; a kvm one means a corrupt file.
  for (const FormatFailure& f : failures) {
    if (f.system == "header_page") {
      return Fail(ErrorCode::kCorrupt,
                  fmt::format("{}: offset {}: corrupt file: the header_page format (the ring "
                              "buffer page layout) does not parse",
                              path, f.offset));
    }
    if (f.system != "kvm" && f.system != "kvmmmu") continue;
    char why[128] = {};
    tep_strerror(dat->tep_, static_cast<tep_errno>(f.error), why, sizeof(why));
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: offset {}: corrupt file: a {} event format does not parse "
                            "(libtraceevent: {})",
                            path, f.offset, f.system, why));
  }
  dat->version_ = L.version;
  dat->compression_ = L.compression;
  std::string clock = L.top_clock;
  if (clock.empty()) clock = base::SelectedClock(L.clock_list);
  if (clock.empty() && !L.buffers.empty()) {
    for (const Layout::Buffer& b : L.buffers) {
      if (!b.clock.empty()) {
        clock = b.clock;
        break;
      }
    }
  }
  if (!clock.empty()) dat->clock_ = clock;
  // TSC2NSEC: timestamps are converted to ns while reading, as trace-cmd report does.
  if (L.tsc2nsec) dat->clock_ = "x86-tsc (converted to ns by the file's TSC2NSEC)";
  uint32_t max_cpu = 0;
  for (const Layout::Buffer& b : L.buffers) {
    for (const Layout::CpuData& c : b.cpus) max_cpu = std::max(max_cpu, c.cpu + 1);
  }
  dat->cpus_ = static_cast<int>(L.cpu_count ? L.cpu_count : max_cpu);
  for (const Layout::CpuStat& cs : ParseCpuStats(L.cpustats)) dat->lost_at_record_ += cs.overrun;
  // common_type's place, to count records per event.
  for (int i = 0; i < tep_get_events_count(dat->tep_); ++i) {
    tep_event* ev = tep_get_event(dat->tep_, i);
    if (tep_format_field* f = ev ? tep_find_common_field(ev, "common_type") : nullptr) {
      dat->type_offset_ = f->offset;
      dat->type_size_ = f->size;
      break;
    }
  }
  dat->swap_ = tep_is_file_bigendian(dat->tep_) != tep_is_local_bigendian(dat->tep_);
  return dat;
}

TraceCmdDat::~TraceCmdDat() {
  if (tep_ != nullptr) tep_free(tep_);
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

void TraceCmdDat::Count(const void* data, int size) noexcept {
  if (type_offset_ < 0 || size < type_offset_ + type_size_) return;
  const auto* p = static_cast<const uint8_t*>(data) + type_offset_;
  uint32_t type = 0;
  if (type_size_ == 2) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    type = swap_ ? __builtin_bswap16(v) : v;
  } else if (type_size_ == 4) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    type = swap_ ? __builtin_bswap32(v) : v;
  } else if (type_size_ == 1) {
    type = *p;
  } else {
    return;
  }
  if (type >= per_type_.size()) {
    if (type > 0xffff) return;
    per_type_.resize(type + 1, 0);
  }
  ++per_type_[type];
}

std::vector<DatEventCount> TraceCmdDat::event_counts() const {
  std::vector<DatEventCount> out;
  for (size_t id = 0; id < per_type_.size(); ++id) {
    if (per_type_[id] == 0) continue;
    tep_event* ev = tep_ ? tep_find_event(tep_, static_cast<int>(id)) : nullptr;
    if (ev != nullptr) {
      out.push_back({ev->system ? ev->system : "", ev->name ? ev->name : "", per_type_[id]});
    } else {
      out.push_back({fmt::format("#{}", id), "unknown", per_type_[id]});
    }
  }
  std::sort(out.begin(), out.end(), [](const DatEventCount& a, const DatEventCount& b) {
    return std::tie(a.system, a.name) < std::tie(b.system, b.name);
  });
  return out;
}

Status TraceCmdDat::ReadAll(KvmPairer* pairer) {
  KvmTepDecoder decoder(allow_mapped_ ? tep_ : nullptr);
  records_read_ = 0;
  chunks_read_ = 0;
  per_type_.assign(per_type_.size(), 0);
  used_mapped_ = allow_mapped_;
  Status s = allow_mapped_ ? ReadOwn(pairer, &decoder) : ReadLibTraceCmd(pairer, nullptr);
  if (!s) return s;
  return {};
}

Status TraceCmdDat::ReadOwn(KvmPairer* pairer, KvmTepDecoder* decoder) {
  const Layout& L = *layout_;
  const uint32_t page = L.page_size;
  const int header_long = tep_get_header_page_size(tep_);
  const uint32_t lsize = header_long == 4 || (header_long <= 0 && L.long_size == 4) ? 4 : 8;
  const Codecs& codecs = Codecs::Get();
  std::vector<Stream> streams;
  for (size_t bi = 0; bi < L.buffers.size(); ++bi) {
    const Layout::Buffer& b = L.buffers[bi];
    for (const Layout::CpuData& c : b.cpus) {
      Stream s;
      s.cpu = c.cpu;
      s.buffer = bi;
      s.compressed = b.compressed;
      s.pos = c.offset;
      s.end = c.offset + c.size;
      if (s.compressed) {
        Bytes h(std::string_view(reinterpret_cast<const char*>(map_), map_size_), L.big);
        h.Seek(c.offset);
        h.U(4, &s.chunks_left);  // checked at Open
        s.pos = c.offset + 4;
      }
      streams.push_back(std::move(s));
    }
  }
  const auto cleanup = [&] {
    for (Stream& s : streams) {
      if (s.kbuf) kbuffer_free(s.kbuf);
    }
  };
  for (Stream& s : streams) {
    s.kbuf = kbuffer_alloc(lsize == 8 ? KBUFFER_LSIZE_8 : KBUFFER_LSIZE_4,
                           L.big ? KBUFFER_ENDIAN_BIG : KBUFFER_ENDIAN_LITTLE);
    if (s.kbuf == nullptr) {
      cleanup();
      return Fail(ErrorCode::kInternal, fmt::format("{}: cannot allocate a kbuffer", path_));
    }
  }
  uint64_t live = 0;  // bytes of decompressed chunks held by all streams
  Status error;
  // The next page of `s`: 1 and *p, *off; 0 at its end; -1 with `error` set.
  const auto next_page = [&](Stream& s, const uint8_t** p, uint64_t* off) -> int {
    if (!s.compressed) {
      if (s.pos >= s.end) return 0;
      *off = s.pos;
      if (s.pos + page + kPad <= map_size_) {
        *p = map_ + s.pos;
      } else {  // the file's last page: copy so that kbuffer's reads past it stay in memory
        s.chunk.assign(page + kPad, 0);
        std::memcpy(s.chunk.data(), map_ + s.pos, page);
        *p = s.chunk.data();
      }
      s.pos += page;
      ++chunks_read_;
      return 1;
    }
    if (s.chunk_pos >= s.chunk_bytes) {
      if (s.chunks_left == 0) return 0;
      Bytes h(std::string_view(reinterpret_cast<const char*>(map_), map_size_), L.big);
      h.Seek(s.pos);
      uint64_t csize = 0, usize = 0;
      if (!h.U(4, &csize) || !h.U(4, &usize) || csize > map_size_ - h.offset() ||
          usize > kMaxChunk || usize % page != 0) {
        error = Fail(ErrorCode::kCorrupt, fmt::format("{}: offset {}: corrupt CPU {} chunk header",
                                                      path_, s.pos, s.cpu));
        return -1;
      }
      const uint64_t need = usize + kPad;
      if (need > s.chunk.size()) {
        live += need - s.chunk.size();
        const uint64_t budget = std::min<uint64_t>(kMaxLiveChunks, 4096 * map_size_);
        if (live > budget) {
          error = Fail(ErrorCode::kCorrupt,
                       fmt::format("{}: offset {}: corrupt file: CPU data chunks would hold "
                                   "{} bytes at once (limit {})",
                                   path_, s.pos, live, budget));
          return -1;
        }
        s.chunk.resize(need);
      }
      std::memset(s.chunk.data() + usize, 0, kPad);
      if (!codecs.Decompress(L.compression, map_ + h.offset(), csize, s.chunk.data(), usize)) {
        error = Fail(ErrorCode::kCorrupt,
                     fmt::format("{}: offset {}: corrupt file: CPU {} chunk does not "
                                 "decompress ({}, {} -> {} bytes)",
                                 path_, s.pos, s.cpu, L.compression, csize, usize));
        return -1;
      }
      s.chunk_offset = s.pos;
      s.chunk_bytes = usize;
      s.chunk_pos = 0;
      s.pos = h.offset() + csize;
      --s.chunks_left;
      ++chunks_read_;
    }
    *p = s.chunk.data() + s.chunk_pos;
    *off = s.chunk_offset;
    s.chunk_pos += page;
    return 1;
  };
  const auto advance = [&](Stream& s) -> bool {
    while (s.ev == nullptr) {
      const uint8_t* p = nullptr;
      uint64_t off = 0;
      const int r = next_page(s, &p, &off);
      if (r <= 0) return r == 0;
      std::string why;
      if (!PageIsSane(p, page, lsize, L.big, &why)) {
        error = Fail(ErrorCode::kCorrupt,
                     fmt::format("{}: offset {}: corrupt CPU {} data{}: {}", path_, off, s.cpu,
                                 s.compressed ? " (in the compressed chunk there)" : "", why));
        return false;
      }
      kbuffer_load_subbuffer(s.kbuf, const_cast<uint8_t*>(p));
      s.last_offset = off;
      if (const int missed = kbuffer_missed_events(s.kbuf); missed != 0) {
        pairer->OnLost(s.cpu, missed);
      }
      s.ev = kbuffer_read_event(s.kbuf, &s.ts);
    }
    return true;
  };
  const auto fix_ts = [&](unsigned long long ts) -> uint64_t {
    uint64_t t = ts + static_cast<uint64_t>(L.ts_offset);
    if (L.tsc2nsec) {
      t = static_cast<uint64_t>((static_cast<unsigned __int128>(t) * L.tsc_mult) >> L.tsc_shift) +
          L.tsc_offset;
    }
    return t;
  };
  for (Stream& s : streams) {
    if (!advance(s)) {
      cleanup();
      return error;
    }
  }
  // Merge by timestamp, the lowest stream index first on ties (as libtracecmd does per CPU).
  using Key = std::pair<unsigned long long, size_t>;
  std::vector<Key> heap;
  const bool use_heap = streams.size() > 16;
  if (use_heap) {
    for (size_t i = 0; i < streams.size(); ++i) {
      if (streams[i].ev) heap.push_back({streams[i].ts, i});
    }
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
  }
  KvmRecord rec;
  KvmRecord other;
  other.type = KvmEventType::kOther;
  uint64_t read = 0;
  for (;;) {
    size_t best = streams.size();
    if (use_heap) {
      if (heap.empty()) break;
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      best = heap.back().second;
      heap.pop_back();
    } else {
      for (size_t i = 0; i < streams.size(); ++i) {
        if (streams[i].ev != nullptr &&
            (best == streams.size() || streams[i].ts < streams[best].ts)) {
          best = i;
        }
      }
      if (best == streams.size()) break;
    }
    Stream& c = streams[best];
    tep_record r{};
    r.ts = fix_ts(c.ts);
    r.data = c.ev;
    r.size = kbuffer_event_size(c.kbuf);
    r.cpu = static_cast<int>(c.cpu);
    ++read;
    ++c.count;
    Count(r.data, r.size);
    if (decoder->Decode(&r, c.cpu, &rec)) {
      pairer->Feed(rec);
    } else {
      other.ts = r.ts;
      other.cpu = c.cpu;
      pairer->Feed(other);
    }
    c.ev = kbuffer_next_event(c.kbuf, &c.ts);
    if (c.ev == nullptr && !advance(c)) {
      records_read_ = read;
      cleanup();
      pairer->Finish();
      return error;
    }
    if (use_heap && c.ev != nullptr) {
      heap.push_back({c.ts, best});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  }
  records_read_ = read;
  pairer->Finish();
  // A capture whose CPU data is cut short reads fewer records than the kernel handed to
  // trace-cmd (CPUSTAT "read events"): report where the data stops.
  for (const Layout::CpuStat& st : ParseCpuStats(L.cpustats)) {
    if (!st.has_read_events) continue;
    for (const Stream& s : streams) {
      if (L.buffers[s.buffer].name == st.buffer && s.cpu == st.cpu && s.count < st.read_events) {
        cleanup();
        return Fail(ErrorCode::kCorrupt,
                    fmt::format("{}: offset {}: CPU {} data ends after {} of {} records "
                                "(truncated or corrupt file)",
                                path_, s.last_offset, s.cpu, s.count, st.read_events));
      }
    }
  }
  cleanup();
  if (decoder->short_records() != 0) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: {} kvm records shorter than their event format (corrupt "
                            "CPU data)",
                            path_, decoder->short_records()));
  }
  return {};
}

namespace {
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

// The reference reader: libtracecmd's own iterator over the top buffer. Not isolated from
// libtracecmd's crashes on corrupt files; tests use it to cross-check ReadOwn.
Status TraceCmdDat::ReadLibTraceCmd(KvmPairer* pairer, KvmTepDecoder*) {
  tracecmd_set_loglevel(TEP_LOG_NONE);
  tracecmd_input* h = tracecmd_open(path_.c_str(), kTraceCmdNoPlugins);
  if (h == nullptr) {
    pairer->Finish();
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: offset {}: libtracecmd cannot read this file", path_, map_size_));
  }
  KvmTepDecoder decoder(tracecmd_get_tep(h));
  IterState st{&decoder, pairer, this, {}, 0, {}, {}};
  const size_t ncpu = static_cast<size_t>(cpus_ > 0 ? cpus_ : 0);
  st.per_cpu.assign(ncpu, 0);
  st.last_offset.assign(ncpu, 0);
  const int rc = tracecmd_iterate_events(h, nullptr, 0, OnRecord, &st);
  tracecmd_close(h);
  pairer->Finish();
  records_read_ = st.read;
  if (rc < 0) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: offset {}: error reading CPU data after {} records", path_,
                            map_size_, st.read));
  }
  if (decoder.short_records() != 0) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: {} kvm records shorter than their event format (corrupt "
                            "CPU data)",
                            path_, decoder.short_records()));
  }
  return {};
}

}  // namespace exitscope::sources
