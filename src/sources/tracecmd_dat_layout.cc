// sources/tracecmd_dat_layout.cc: a .dat file's layout, every offset checked against the file
// size (tracecmd_dat_layout.h).

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
#include "sources/tracecmd_dat_layout.h"

namespace exitscope::sources {

PopulatedBytes::PopulatedBytes(size_t n) {
  if (n == 0) return;
  constexpr size_t kHuge = size_t{2} << 20;
  if (n >= kHuge / 2) {
    // Transparent huge pages where the kernel offers them (madvise mode): one fault per
    // 2 MiB. The event formats of a capture decompress to about 2 MB, which took 3.0-3.4 ms
    // in 4 KiB pages in the kvm-pvm guests here and 0.15-0.3 ms this way.
    const size_t len = (n + kHuge - 1) / kHuge * kHuge;
    void* r =
        ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return;
    auto* raw = static_cast<uint8_t*>(r);
    const uintptr_t at = (reinterpret_cast<uintptr_t>(raw) + kHuge - 1) & ~(kHuge - 1);
    auto* p = reinterpret_cast<uint8_t*>(at);
    if (p > raw) ::munmap(raw, static_cast<size_t>(p - raw));
    if (const size_t tail = static_cast<size_t>(raw + len + kHuge - (p + len)); tail != 0) {
      ::munmap(p + len, tail);
    }
    ::madvise(p, len, MADV_HUGEPAGE);        // no THP: the 4 KiB pages below
    ::madvise(p, len, MADV_POPULATE_WRITE);  // Linux 5.14; before it the writes fault them
    p_ = p;
    n_ = n;
    mapped_ = len;
    return;
  }
  void* m =
      ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (m == MAP_FAILED) return;
  p_ = static_cast<uint8_t*>(m);
  n_ = n;
  mapped_ = n;
}

PopulatedBytes::~PopulatedBytes() {
  if (p_ != nullptr) ::munmap(p_, mapped_);
}

}  // namespace exitscope::sources

namespace exitscope::sources::dat {
namespace {

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
      AddFormat(text, "ftrace", at);
    }
    return {};
  }
  void AddFormat(std::string_view text, std::string system, uint64_t at) {
    Layout::Format& f = L_->formats.emplace_back();
    f.text = text;
    f.system = std::move(system);
    f.offset = at;
    f.declared = ScanFormatHeader(text, &f.name, &f.id);
  }
  Status EventFormats(Bytes& b, uint64_t section_offset) {
    uint64_t systems = 0;
    if (!b.U(4, &systems)) return Cut(b.offset(), "event system count");
    if (systems > b.left() / 5) return Bad(b.offset(), fmt::format("{} event systems", systems));
    // A host saves about 2400 formats of 500-1000 bytes: room for them at once rather than by
    // doubling (each doubling moves them all and faults in new pages). Pages reserved and not
    // used are never touched; the cap keeps a version 6 file, whose formats are followed by
    // the rest of the file, from reserving for its CPU data.
    L_->formats.reserve(L_->formats.size() +
                        static_cast<size_t>(std::min<uint64_t>(b.left() / 512, 1 << 16)));
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
        AddFormat(text, std::string(name), at);
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
    PopulatedBytes& out = L_->owned.emplace_back(usize);
    if (usize != 0 && out.data() == nullptr) {
      return Fail(ErrorCode::kIo,
                  fmt::format("{}: offset {}: cannot map {} bytes for the {} section", path_, off,
                              usize, what));
    }
    if (!Codecs::Get().Decompress(L_->compression, reinterpret_cast<const uint8_t*>(data.data()),
                                  data.size(), out.data(), usize)) {
      return Bad(off,
                 fmt::format("the {} section does not decompress ({})", what, L_->compression));
    }
    *body = std::string_view(reinterpret_cast<const char*>(out.data()), usize);
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

}  // namespace

Status ParseLayout(std::string_view file, const std::string& path, Layout* out) {
  return LayoutParser(file, path).Parse(out);
}

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

}  // namespace exitscope::sources::dat
