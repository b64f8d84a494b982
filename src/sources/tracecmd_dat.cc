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
#include "sources/kvm_trace.h"

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

// The parsed file: where everything is, checked against the file size.
struct TraceCmdDat::Layout {
  struct Format {
    std::string_view text;
    std::string system;
    uint64_t offset = 0;  // in the file (of its section when the section is compressed)
  };
  struct CpuData {
    uint32_t cpu = 0;
    uint64_t offset = 0, size = 0;  // in the file; compressed: chunk count, then the chunks
  };
  struct Buffer {
    std::string name, clock;
    bool compressed = false;
    std::vector<CpuData> cpus;
  };
  struct CpuStat {
    std::string buffer;
    uint32_t cpu = 0;
    uint64_t overrun = 0, read_events = 0;
    bool has_read_events = false;
  };
  int version = 0;
  bool big = false;
  uint32_t long_size = 8;
  uint32_t page_size = 0;
  std::string compression = "none";
  std::string header_page;
  uint64_t header_page_offset = 0;
  std::vector<Format> formats;
  std::deque<std::string> owned;  // decompressed sections the formats point into
  std::vector<Buffer> buffers;
  std::string cpustats, clock_list, top_clock;
  uint32_t cpu_count = 0;  // CPUCOUNT / v6 header; 0 unknown
  int64_t ts_offset = 0;
  bool tsc2nsec = false;
  uint32_t tsc_mult = 0, tsc_shift = 0;
  uint64_t tsc_offset = 0;
};

namespace {

using Layout = TraceCmdDat::Layout;

constexpr int kTraceCmdNoPlugins = 1 << 0;  // TRACECMD_FL_LOAD_NO_PLUGINS
constexpr std::string_view kMagic = "\x17\x08\x44tracing";
// Bounds (docs/trace-files.md): a decompressed metadata section, one decompressed chunk of
// CPU data, all chunks held at once, CPU streams per file.
constexpr uint64_t kMaxSection = 64ull << 20;
constexpr uint64_t kMaxChunk = 16ull << 20;
constexpr uint64_t kMaxLiveChunks = 512ull << 20;
constexpr size_t kMaxStreams = 8192;
constexpr uint64_t kMaxCpus = 8192;  // Linux's largest NR_CPUS (x86 MAXSMP)
constexpr size_t kPad = 64;  // zeroed bytes after every page buffer: kbuffer reads up to 8 past

// trace-cmd option / section ids (trace-cmd.dat.v7(5)).
enum : uint16_t {
  kOptDone = 0,
  kOptCpuStat = 2,
  kOptBuffer = 3,
  kOptTraceClock = 4,
  kOptOffset = 7,
  kOptCpuCount = 8,
  kOptTsc2Nsec = 14,
  kOptHeaderInfo = 16,
  kOptFtraceEvents = 17,
  kOptEventFormats = 18,
  kOptBufferText = 22,
};

// The decompressors trace-cmd writes with: zstd (Debian's trace-cmd 3.1) and zlib.
struct Codecs {
  static const Codecs& Get() {
    static const Codecs c;
    return c;
  }
  bool Supports(std::string_view algo) const { return algo == "zstd" || algo == "zlib"; }
  // Decompresses exactly `dst_len` bytes; false on any error or a different size.
  bool Decompress(std::string_view algo, const uint8_t* src, size_t src_len, uint8_t* dst,
                  size_t dst_len) const {
    if (algo == "zstd") {
      // One context per thread, reused: ZSTD_decompress would set one up per chunk.
      struct FreeDctx {
        void operator()(ZSTD_DCtx* d) const noexcept { ZSTD_freeDCtx(d); }
      };
      thread_local const std::unique_ptr<ZSTD_DCtx, FreeDctx> dctx(ZSTD_createDCtx());
      const size_t n = dctx ? ZSTD_decompressDCtx(dctx.get(), dst, dst_len, src, src_len)
                            : ZSTD_decompress(dst, dst_len, src, src_len);
      return !ZSTD_isError(n) && n == dst_len;
    }
    if (algo == "zlib") {
      uLongf n = dst_len;
      return ::uncompress(dst, &n, src, src_len) == Z_OK && n == dst_len;
    }
    return false;
  }
};

// Bounds-checked reads from a byte range in the file's endianness. `base` is the file
// offset of data[0] (for messages); a failed read records where and what.
class Bytes {
 public:
  Bytes(std::string_view data, bool big, uint64_t base = 0) : d_(data), big_(big), base_(base) {}
  bool U(int n, uint64_t* v) {
    if (pos_ > d_.size() || static_cast<size_t>(n) > d_.size() - pos_) return false;
    uint64_t x = 0;
    for (int i = 0; i < n; ++i) {
      const uint64_t b = static_cast<uint8_t>(d_[pos_ + static_cast<size_t>(i)]);
      x |= big_ ? b << (8 * (n - 1 - i)) : b << (8 * i);
    }
    pos_ += static_cast<size_t>(n);
    *v = x;
    return true;
  }
  bool Str(std::string_view* s) {
    if (pos_ > d_.size()) return false;
    const size_t nul = d_.find('\0', pos_);
    if (nul == std::string_view::npos) return false;
    *s = d_.substr(pos_, nul - pos_);
    pos_ = nul + 1;
    return true;
  }
  bool Take(uint64_t n, std::string_view* s) {
    if (pos_ > d_.size() || n > d_.size() - pos_) return false;
    *s = d_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool Tag(std::string_view tag) {  // tag + NUL
    std::string_view s;
    return Str(&s) && s == tag;
  }
  size_t pos() const { return pos_; }
  uint64_t offset() const { return base_ + pos_; }
  size_t left() const { return pos_ < d_.size() ? d_.size() - pos_ : 0; }
  void Seek(size_t p) { pos_ = p; }

 private:
  std::string_view d_;
  bool big_;
  uint64_t base_;
  size_t pos_ = 0;
};

class LayoutParser {
 public:
  LayoutParser(std::string_view file, const std::string& path) : f_(file), path_(path) {}

  Status Parse(Layout* out) {
    L_ = out;
    Bytes b(f_, false);
    b.Seek(kMagic.size());
    std::string_view version;
    if (!b.Str(&version)) return Cut(b.offset(), "version string");
    L_->version = version == "6" ? 6 : version == "7" ? 7 : 0;
    if (L_->version == 0) {
      return Fail(ErrorCode::kUnsupported,
                  fmt::format("{}: offset {}: unsupported trace-cmd file version '{}' (6 and 7 "
                              "are read)",
                              path_, kMagic.size(), version.substr(0, 8)));
    }
    uint64_t endian = 0, long_size = 0, page = 0;
    if (!b.U(1, &endian) || !b.U(1, &long_size)) return Cut(b.offset(), "file header");
    L_->big = endian != 0;
    big_ = L_->big;
    Bytes b2(f_, big_);
    b2.Seek(b.pos());
    if (!b2.U(4, &page)) return Cut(b2.offset(), "page size");
    if (long_size != 4 && long_size != 8) {
      return Bad(b2.offset() - 5, fmt::format("long size {} (4 or 8 expected)", long_size));
    }
    if (page < 256 || page > (1u << 24) || (page & (page - 1)) != 0) {
      return Bad(b2.offset() - 4,
                 fmt::format("page size {} (a power of two from 256 to 16 MiB expected)", page));
    }
    L_->long_size = static_cast<uint32_t>(long_size);
    L_->page_size = static_cast<uint32_t>(page);
    Status s = L_->version == 6 ? ParseV6(b2) : ParseV7(b2);
    if (!s) return s;
    return CheckData();
  }

 private:
  Status Cut(uint64_t at, std::string_view what) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: offset {}: file ends inside the {} (truncated)", path_,
                            std::min<uint64_t>(at, f_.size()), what));
  }
  Status Bad(uint64_t at, std::string_view what) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: offset {}: corrupt file: {}", path_, at, what));
  }

  // header_page / header_event blocks (v6 header, v7 HEADER_INFO section).
  Status HeaderInfo(Bytes& b) {
    std::string_view blob;
    uint64_t n = 0;
    if (!b.Tag("header_page")) return Bad(b.offset(), "expected \"header_page\"");
    if (!b.U(8, &n)) return Cut(b.offset(), "header_page");
    L_->header_page_offset = b.offset();
    if (!b.Take(n, &blob)) return Cut(b.offset(), "header_page");
    L_->header_page.assign(blob);
    // The page layout this reader (and kbuffer) assumes: u64 timestamp, commit, data.
    for (std::string_view field : {"timestamp;", "commit;", "data;"}) {
      const size_t at = blob.find(field);
      if (at == std::string_view::npos || at == 0 ||
          (blob[at - 1] != ' ' && blob[at - 1] != '\t')) {
        return Bad(L_->header_page_offset, fmt::format("the header_page format has no '{}' field",
                                                       field.substr(0, field.size() - 1)));
      }
    }
    if (!b.Tag("header_event")) return Bad(b.offset(), "expected \"header_event\"");
    if (!b.U(8, &n) || !b.Take(n, &blob)) return Cut(b.offset(), "header_event");
    return {};
  }
  Status FtraceFormats(Bytes& b, uint64_t section_offset) {
    uint64_t n = 0;
    if (!b.U(4, &n)) return Cut(b.offset(), "ftrace format count");
    if (n > b.left() / 8) return Bad(b.offset(), fmt::format("{} ftrace formats", n));
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t len = 0;
      std::string_view text;
      if (!b.U(8, &len)) return Cut(b.offset(), "ftrace event format");
      const uint64_t at = section_offset ? section_offset : b.offset();
      if (!b.Take(len, &text)) return Cut(b.offset(), "ftrace event format");
      L_->formats.push_back({text, "ftrace", at});
    }
    return {};
  }
  Status EventFormats(Bytes& b, uint64_t section_offset) {
    uint64_t systems = 0;
    if (!b.U(4, &systems)) return Cut(b.offset(), "event system count");
    if (systems > b.left() / 5) return Bad(b.offset(), fmt::format("{} event systems", systems));
    for (uint64_t s = 0; s < systems; ++s) {
      std::string_view name;
      uint64_t n = 0;
      if (!b.Str(&name)) return Cut(b.offset(), "event system name");
      if (!b.U(4, &n)) return Cut(b.offset(), "event count");
      if (n > b.left() / 8) return Bad(b.offset(), fmt::format("{} events", n));
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t len = 0;
        std::string_view text;
        if (!b.U(8, &len)) return Cut(b.offset(), "event format");
        const uint64_t at = section_offset ? section_offset : b.offset();
        if (!b.Take(len, &text)) return Cut(b.offset(), "event format");
        L_->formats.push_back({text, std::string(name), at});
      }
    }
    return {};
  }

  // One option (id, data); `data_offset` is its file offset. v6 and v7 share most.
  Status Option(uint16_t id, std::string_view data, uint64_t data_offset) {
    Bytes o(data, big_, data_offset);
    switch (id) {
      case kOptCpuStat:
        L_->cpustats.append(data.substr(0, data.find('\0')));
        break;
      case kOptTraceClock:
        L_->clock_list.assign(data.substr(0, data.find('\0')));
        break;
      case kOptOffset: {
        const std::string s(data.substr(0, data.find('\0')));
        L_->ts_offset += std::strtoll(s.c_str(), nullptr, 0);
        break;
      }
      case kOptCpuCount: {
        uint64_t n = 0;
        if (!o.U(4, &n)) return Bad(data_offset, "short CPUCOUNT option");
        if (n > kMaxCpus) {
          return Bad(data_offset,
                     fmt::format("CPU count {} (Linux has at most {} CPUs)", n, kMaxCpus));
        }
        L_->cpu_count = static_cast<uint32_t>(n);
        break;
      }
      case kOptTsc2Nsec: {
        uint64_t mult = 0, shift = 0, off = 0;
        if (!o.U(4, &mult) || !o.U(4, &shift) || !o.U(8, &off)) {
          return Bad(data_offset, "short TSC2NSEC option");
        }
        if (mult != 0 && shift < 64) {
          L_->tsc2nsec = true;
          L_->tsc_mult = static_cast<uint32_t>(mult);
          L_->tsc_shift = static_cast<uint32_t>(shift);
          L_->tsc_offset = off;
        }
        break;
      }
      case kOptBuffer:
        return L_->version == 6 ? BufferV6(o) : BufferV7(o);
      case kOptBufferText:
        return Fail(ErrorCode::kUnsupported,
                    fmt::format("{}: offset {}: latency-tracer data (BUFFER_TEXT) is not read: "
                                "record with events, not a latency tracer",
                                path_, data_offset));
      default:
        break;
    }
    return {};
  }

  Status CpuTable(Bytes& b, uint64_t cpus, Layout::Buffer* buf) {
    if (cpus > b.left() / 16) return Cut(b.offset(), "CPU data table");
    for (uint64_t c = 0; c < cpus; ++c) {
      uint64_t off = 0, size = 0;
      if (!b.U(8, &off) || !b.U(8, &size)) return Cut(b.offset(), "CPU data table");
      if (size != 0) buf->cpus.push_back({static_cast<uint32_t>(c), off, size});
    }
    return {};
  }

  // v6 BUFFER option: offset of "flyrecord\0" + CPU table, then the instance name.
  Status BufferV6(Bytes& o) {
    uint64_t off = 0;
    std::string_view name;
    if (!o.U(8, &off) || !o.Str(&name)) return Bad(o.offset(), "short BUFFER option");
    if (off > f_.size()) return Cut(off, "buffer CPU table");
    Bytes b(f_, big_);
    b.Seek(off);
    if (!b.Tag("flyrecord")) return Bad(off, "buffer option does not point at \"flyrecord\"");
    Layout::Buffer buf;
    buf.name = name;
    if (Status s = CpuTable(b, v6_cpus_, &buf); !s) return s;
    L_->buffers.push_back(std::move(buf));
    return {};
  }

  Status ParseV6(Bytes& b) {
    if (Status s = HeaderInfo(b); !s) return s;
    if (Status s = FtraceFormats(b, 0); !s) return s;
    if (Status s = EventFormats(b, 0); !s) return s;
    std::string_view blob;
    uint64_t n = 0;
    if (!b.U(4, &n) || !b.Take(n, &blob)) return Cut(b.offset(), "kallsyms");
    if (!b.U(4, &n) || !b.Take(n, &blob)) return Cut(b.offset(), "printk formats");
    if (!b.U(8, &n) || !b.Take(n, &blob)) return Cut(b.offset(), "saved cmdlines");
    if (!b.U(4, &v6_cpus_)) return Cut(b.offset(), "CPU count");
    if (v6_cpus_ > kMaxCpus) {
      return Bad(b.offset() - 4,
                 fmt::format("CPU count {} (Linux has at most {} CPUs)", v6_cpus_, kMaxCpus));
    }
    if (v6_cpus_ > b.left() / 16) {
      return Bad(b.offset() - 4,
                 fmt::format("CPU count {} needs a CPU table larger than the file", v6_cpus_));
    }
    L_->cpu_count = static_cast<uint32_t>(v6_cpus_);
    for (;;) {  // "options  \0" blocks, then "flyrecord\0" or "latency  \0"
      std::string_view tag;
      if (!b.Take(10, &tag)) return Cut(b.offset(), "section tag");
      if (tag == std::string_view("options  \0", 10)) {
        for (;;) {
          uint64_t id = 0, size = 0;
          if (!b.U(2, &id)) return Cut(b.offset(), "option id");
          if (id == 0) break;
          if (!b.U(4, &size)) return Cut(b.offset(), "option");
          const uint64_t at = b.offset();
          if (!b.Take(size, &blob)) return Cut(b.offset(), "option");
          if (Status s = Option(static_cast<uint16_t>(id), blob, at); !s) return s;
        }
        continue;
      }
      if (tag == std::string_view("latency  \0", 10)) {
        return Fail(ErrorCode::kUnsupported,
                    fmt::format("{}: offset {}: latency-tracer data is not read: record with "
                                "events, not a latency tracer",
                                path_, b.offset() - 10));
      }
      if (tag != std::string_view("flyrecord\0", 10)) {
        return Bad(b.offset() - 10, "expected options or flyrecord section");
      }
      break;
    }
    Layout::Buffer top;
    if (Status s = CpuTable(b, v6_cpus_, &top); !s) return s;
    L_->buffers.insert(L_->buffers.begin(), std::move(top));
    return {};
  }

  // A v7 section at `off`: checks its header and returns its content, decompressed when
  // flagged (into L_->owned).
  Status Section(uint64_t off, uint16_t want_id, std::string_view what, std::string_view* body,
                 bool* compressed = nullptr) {
    Bytes b(f_, big_);
    if (off > f_.size()) return Cut(off, what);
    b.Seek(off);
    uint64_t id = 0, flags = 0, str = 0, size = 0;
    if (!b.U(2, &id) || !b.U(2, &flags) || !b.U(4, &str) || !b.U(8, &size)) {
      return Cut(b.offset(), what);
    }
    if (id != want_id) {
      return Bad(off, fmt::format("section id {} where the {} section (id {}) should be", id, what,
                                  want_id));
    }
    if (compressed) *compressed = (flags & 1) != 0;
    if (want_id == kOptBuffer) {  // flyrecord: the CPU data follows at its own offsets
      *body = {};
      return {};
    }
    std::string_view raw;
    if (!b.Take(size, &raw)) return Cut(b.offset(), what);
    if ((flags & 1) == 0) {
      *body = raw;
      return {};
    }
    Bytes c(raw, big_, off + 16);
    uint64_t csize = 0, usize = 0;
    std::string_view data;
    if (!c.U(4, &csize) || !c.U(4, &usize) || !c.Take(csize, &data)) {
      return Cut(c.offset(), fmt::format("compressed {} section", what));
    }
    if (Status s = CheckCodec(off); !s) return s;
    if (usize > kMaxSection || usize > 1024 * csize + 4096) {
      return Bad(off, fmt::format("the {} section claims {} bytes from {} compressed (limit "
                                  "{} MiB, ratio 1024)",
                                  what, usize, csize, kMaxSection >> 20));
    }
    std::string& out = L_->owned.emplace_back(usize, '\0');
    if (!Codecs::Get().Decompress(L_->compression, reinterpret_cast<const uint8_t*>(data.data()),
                                  data.size(), reinterpret_cast<uint8_t*>(out.data()), usize)) {
      return Bad(off,
                 fmt::format("the {} section does not decompress ({})", what, L_->compression));
    }
    *body = out;
    return {};
  }
  Status CheckCodec(uint64_t at) {
    if (Codecs::Get().Supports(L_->compression)) return {};
    return Fail(ErrorCode::kUnsupported,
                fmt::format("{}: offset {}: compression '{}' is not supported (zstd and zlib "
                            "are)",
                            path_, at, L_->compression.substr(0, 32)));
  }

  // v7 BUFFER option: flyrecord section offset, name, clock, page size, CPU entries.
  Status BufferV7(Bytes& o) {
    uint64_t off = 0, page = 0, n = 0;
    std::string_view name, clock;
    if (!o.U(8, &off) || !o.Str(&name) || !o.Str(&clock) || !o.U(4, &page) || !o.U(4, &n)) {
      return Bad(o.offset(), "short BUFFER option");
    }
    if (page != L_->page_size) {
      return Fail(ErrorCode::kUnsupported,
                  fmt::format("{}: offset {}: buffer '{}' has page size {}, the file {}", path_,
                              o.offset(), name.substr(0, 64), page, L_->page_size));
    }
    if (n > o.left() / 20) {
      return Bad(o.offset() - 4, fmt::format("buffer '{}' lists {} CPUs in a {}-byte option",
                                             name.substr(0, 64), n, o.left()));
    }
    Layout::Buffer buf;
    buf.name = name;
    buf.clock = clock;
    std::string_view unused;
    if (Status s = Section(off, kOptBuffer, "flyrecord", &unused, &buf.compressed); !s) return s;
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t cpu = 0, coff = 0, csize = 0;
      if (!o.U(4, &cpu) || !o.U(8, &coff) || !o.U(8, &csize)) {
        return Bad(o.offset(), "short BUFFER option");
      }
      if (csize != 0) buf.cpus.push_back({static_cast<uint32_t>(cpu), coff, csize});
    }
    if (buf.name.empty()) L_->top_clock = buf.clock;
    L_->buffers.push_back(std::move(buf));
    return {};
  }

  Status ParseV7(Bytes& b) {
    std::string_view algo, algo_version;
    if (!b.Str(&algo) || !b.Str(&algo_version)) return Cut(b.offset(), "compression header");
    L_->compression = algo;
    if (algo != "none" && algo.size() > 32) return Bad(b.offset(), "compression name");
    uint64_t next = 0;
    if (!b.U(8, &next)) return Cut(b.offset(), "first options offset");
    std::set<uint64_t> seen;
    bool header = false;
    while (next != 0) {
      if (!seen.insert(next).second) return Bad(next, "options sections form a loop");
      std::string_view body;
      const uint64_t at = next;
      if (Status s = Section(at, kOptDone, "options", &body); !s) return s;
      Bytes o(body, big_, at + 16);
      next = 0;
      for (;;) {
        uint64_t id = 0, size = 0;
        std::string_view data;
        if (!o.U(2, &id) || !o.U(4, &size)) return Cut(o.offset(), "option");
        const uint64_t data_at = o.offset();
        if (!o.Take(size, &data)) return Cut(o.offset(), "option");
        if (id == kOptDone) {
          Bytes d(data, big_, data_at);
          if (!d.U(8, &next)) return Bad(data_at, "short DONE option");
          break;
        }
        if (id == kOptHeaderInfo || id == kOptFtraceEvents || id == kOptEventFormats) {
          Bytes d(data, big_, data_at);
          uint64_t soff = 0;
          if (!d.U(8, &soff)) return Bad(data_at, "short section option");
          std::string_view sbody;
          const char* what = id == kOptHeaderInfo     ? "header info"
                             : id == kOptFtraceEvents ? "ftrace events"
                                                      : "event formats";
          if (Status s = Section(soff, static_cast<uint16_t>(id), what, &sbody); !s) return s;
          const bool in_file = sbody.data() >= f_.data() && sbody.data() < f_.data() + f_.size();
          const uint64_t base = in_file ? static_cast<uint64_t>(sbody.data() - f_.data()) : soff;
          Bytes sb(sbody, big_, base);
          Status s;
          if (id == kOptHeaderInfo) {
            s = HeaderInfo(sb);
            header = true;
          } else if (id == kOptFtraceEvents) {
            s = FtraceFormats(sb, in_file ? 0 : soff);
          } else {
            s = EventFormats(sb, in_file ? 0 : soff);
          }
          if (!s) return s;
          continue;
        }
        if (Status s = Option(static_cast<uint16_t>(id), data, data_at); !s) return s;
      }
    }
    if (!header) return Bad(f_.size(), "no HEADER_INFO section (header_page)");
    return {};
  }

  // Every CPU's data lies inside the file, ranges do not overlap, and compressed data is a
  // well-formed chunk list whose sizes fit the bounds.
  Status CheckData() {
    struct Range {
      uint64_t begin, end;
      size_t buffer;
      uint32_t cpu;
    };
    std::vector<Range> ranges;
    size_t streams = 0;
    for (size_t bi = 0; bi < L_->buffers.size(); ++bi) {
      Layout::Buffer& buf = L_->buffers[bi];
      if (buf.compressed) {
        if (Status s = CheckCodec(0); !s) return s;
      }
      for (const Layout::CpuData& c : buf.cpus) {
        if (c.cpu >= kMaxCpus || (L_->cpu_count != 0 && c.cpu >= L_->cpu_count)) {
          return Bad(c.offset, fmt::format("data for CPU {} in a file of {} CPUs", c.cpu,
                                           L_->cpu_count ? L_->cpu_count : kMaxCpus));
        }
        if (++streams > kMaxStreams) {
          return Fail(ErrorCode::kUnsupported,
                      fmt::format("{}: more than {} CPU data streams", path_, kMaxStreams));
        }
        if (c.offset > f_.size() || c.size > f_.size() - c.offset) {
          return Fail(ErrorCode::kCorrupt,
                      fmt::format("{}: offset {}: CPU {} data [{}, {}) extends past the end of "
                                  "the file (truncated)",
                                  path_, f_.size(), c.cpu, c.offset, c.offset + c.size));
        }
        uint64_t end = c.offset + c.size;
        if (!buf.compressed) {
          if (c.size % L_->page_size != 0) {
            return Bad(c.offset, fmt::format("CPU {} data size {} is not a multiple of the "
                                             "page size {}",
                                             c.cpu, c.size, L_->page_size));
          }
        } else {
          Bytes b(f_, big_);
          b.Seek(c.offset);
          uint64_t chunks = 0;
          if (!b.U(4, &chunks)) return Cut(b.offset(), "compressed CPU data");
          // trace-cmd's recorded size leaves out the 4-byte chunk count.
          const uint64_t limit = std::min<uint64_t>(f_.size(), end + 4);
          for (uint64_t k = 0; k < chunks; ++k) {
            uint64_t csize = 0, usize = 0;
            const uint64_t at = b.offset();
            std::string_view data;
            if (at + 8 > limit || !b.U(4, &csize) || !b.U(4, &usize) ||
                csize > limit - b.offset() || !b.Take(csize, &data)) {
              return Fail(ErrorCode::kCorrupt,
                          fmt::format("{}: offset {}: CPU {} compressed chunk {} of {} extends "
                                      "past its data (truncated or corrupt file)",
                                      path_, at, c.cpu, k, chunks));
            }
            if (usize == 0 || usize % L_->page_size != 0 || usize > kMaxChunk) {
              return Bad(at, fmt::format("CPU {} chunk {} claims {} bytes uncompressed (a "
                                         "multiple of the page size, at most {} MiB)",
                                         c.cpu, k, usize, kMaxChunk >> 20));
            }
          }
          end = b.offset();
        }
        ranges.push_back({c.offset, end, bi, c.cpu});
      }
    }
    std::sort(ranges.begin(), ranges.end(),
              [](const Range& a, const Range& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].begin < ranges[i - 1].end) {
        return Bad(ranges[i].begin,
                   fmt::format("CPU {} data overlaps CPU {} data at {}", ranges[i].cpu,
                               ranges[i - 1].cpu, ranges[i - 1].begin));
      }
    }
    return {};
  }

  std::string_view f_;
  const std::string& path_;
  Layout* L_ = nullptr;
  bool big_ = false;
  uint64_t v6_cpus_ = 0;
};

// Parses "CPU: 0\n...overrun: N\n...read events: M\n" blocks; "Buffer: NAME" lines switch
// to an instance's CPUs.
std::vector<Layout::CpuStat> ParseCpuStats(std::string_view text) {
  const auto num = [](std::string_view s) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    uint64_t v = 0;
    std::from_chars(s.data(), s.data() + s.size(), v);
    return v;
  };
  std::vector<Layout::CpuStat> out;
  std::string buffer;
  base::LineSplitter lines(text);
  for (std::string_view line; lines.Next(&line);) {
    if (line.starts_with("Buffer:")) {
      line.remove_prefix(7);
      while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      buffer.assign(line);
    } else if (line.starts_with("CPU:")) {
      out.push_back({buffer, static_cast<uint32_t>(num(line.substr(4))), 0, 0, false});
    } else if (!out.empty() && line.starts_with("overrun:")) {
      out.back().overrun = num(line.substr(8));
    } else if (!out.empty() && line.starts_with("read events:")) {
      out.back().read_events = num(line.substr(12));
      out.back().has_read_events = true;
    }
  }
  return out;
}

// Builds a tep_handle from the file's header page and event formats, as libtracecmd does.
// `progress` (when set) receives the file offset of each format before it is parsed.
struct FormatFailure {
  uint64_t offset;
  std::string system;
  int error;
};
tep_handle* BuildTep(const Layout& L, volatile uint64_t* progress,
                     std::vector<FormatFailure>* failures = nullptr) {
  tep_handle* tep = tep_alloc();
  if (tep == nullptr) return nullptr;
  tep_set_loglevel(TEP_LOG_NONE);
  tep_set_file_bigendian(tep, L.big ? TEP_BIG_ENDIAN : TEP_LITTLE_ENDIAN);
  tep_set_local_bigendian(
      tep, std::endian::native == std::endian::big ? TEP_BIG_ENDIAN : TEP_LITTLE_ENDIAN);
  tep_set_long_size(tep, static_cast<int>(L.long_size));
  tep_set_page_size(tep, static_cast<int>(L.page_size));
  std::string header = L.header_page;
  if (progress) *progress = L.header_page_offset;
  if (tep_parse_header_page(tep, header.data(), header.size(), static_cast<int>(L.long_size)) !=
          0 &&
      failures) {
    failures->push_back({L.header_page_offset, "header_page", 0});
  }
  for (const Layout::Format& f : L.formats) {
    if (progress) *progress = f.offset;
    // A format libtraceevent refuses leaves its event undefined, as in trace-cmd report.
    const int rc = tep_parse_event(tep, f.text.data(), f.text.size(), f.system.c_str());
    if (rc != 0 && failures) failures->push_back({f.offset, f.system, rc});
  }
  return tep;
}

// Runs BuildTep in a child process first: libtraceevent crashes (SIGSEGV, SIGFPE) or loops
// on some corrupt formats. Returns the error for a child that did not exit cleanly.
Status ProbeFormatsInChild(const Layout& L, const std::string& path, uint64_t file_size) {
  void* shared =
      ::mmap(nullptr, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot map memory to check the event formats: {}",
                                            path, std::strerror(errno)));
  }
  auto* progress = static_cast<volatile uint64_t*>(shared);
  *progress = 0;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::munmap(shared, sizeof(uint64_t));
    return Fail(ErrorCode::kIo, fmt::format("{}: cannot fork to check the event formats: {}", path,
                                            std::strerror(errno)));
  }
  if (pid == 0) {
    // The child's memory is bounded too: formats are at most 64 MiB per section.
    struct rlimit cpu {
      10, 10
    };
    ::setrlimit(RLIMIT_CPU, &cpu);
    ::alarm(30);
    // Whatever the child prints as it parses or dies (libtraceevent's warnings, a sanitizer's
    // report of the crash) is not for the user: the parent reports the outcome in one line.
    if (const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) ::dup2(null, 2);
    tep_handle* tep = BuildTep(L, progress);
    ::_exit(tep != nullptr ? 0 : 3);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const uint64_t last = *progress;
  const uint64_t at = std::min<uint64_t>(last, file_size);
  ::munmap(shared, sizeof(uint64_t));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  const std::string how = WIFSIGNALED(status)
                              ? fmt::format("died of {}", ::sigabbrev_np(WTERMSIG(status))
                                                              ? ::sigabbrev_np(WTERMSIG(status))
                                                              : "a signal")
                              : fmt::format("exited with status {}", WEXITSTATUS(status));
  return Fail(ErrorCode::kCorrupt,
              fmt::format("{}: offset {}: corrupt file: libtraceevent failed on the event format "
                          "at offset {} (its parser {} in a child process)",
                          path, at, at, how));
}

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
  EXITSCOPE_RETURN_IF_ERROR(LayoutParser(file, path).Parse(&L));
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
