// sources/tracecmd_dat_layout.h: the inside of the trace-cmd .dat reader (tracecmd_dat.h), shared
// by its three files: the layout (tracecmd_dat_layout.cc: header, options, sections, where each
// CPU's data is, checked against the file size), the libtraceevent sandbox
// (tracecmd_dat_sandbox.cc: the event formats parsed in a capped child first) and the pages and
// streams (tracecmd_dat.cc: pages checked, then decoded and merged in time order). Not API.
#pragma once

#include <traceevent/event-parse.h>
#include <zlib.h>
#include <zstd.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "exitscope/status.h"
#include "sources/tracecmd_dat.h"

namespace exitscope::sources {

// Memory for a decompressed section, mapped with its pages populated at once: a capture's
// event formats section is about 2 MB, and faulting its pages in one by one cost 4-6 ms of a
// 100 ms report on the kvm-pvm guests these run on (a fault is a trip through the
// hypervisor there). From 1 MiB on, in transparent huge pages where the kernel offers them
// (populated 2 MB: 3.0-3.4 ms in 4 KiB pages, 0.15-0.3 ms in one huge page). Empty when the
// mapping failed.
class PopulatedBytes {
 public:
  explicit PopulatedBytes(size_t n);
  ~PopulatedBytes();
  PopulatedBytes(const PopulatedBytes&) = delete;
  PopulatedBytes& operator=(const PopulatedBytes&) = delete;
  uint8_t* data() const noexcept { return p_; }
  size_t size() const noexcept { return n_; }

 private:
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
  size_t mapped_ = 0;
};

// The parsed file: where everything is, checked against the file size.
struct TraceCmdDat::Layout {
  struct Format {
    std::string_view text;
    std::string system;
    uint64_t offset = 0;  // in the file (of its section when the section is compressed)
    // From its header lines (dat::ScanFormatHeader), read once at ParseLayout; `declared`
    // false when it has no name or no id.
    std::string_view name;
    uint32_t id = 0;
    bool declared = false;
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
  std::deque<PopulatedBytes> owned;  // decompressed sections the formats point into
  std::vector<Buffer> buffers;
  std::string cpustats, clock_list, top_clock;
  uint32_t cpu_count = 0;  // CPUCOUNT / v6 header; 0 unknown
  int64_t ts_offset = 0;
  bool tsc2nsec = false;
  uint32_t tsc_mult = 0, tsc_shift = 0;
  uint64_t tsc_offset = 0;
};

namespace dat {

using Layout = TraceCmdDat::Layout;

inline constexpr int kTraceCmdNoPlugins = 1 << 0;  // TRACECMD_FL_LOAD_NO_PLUGINS
inline constexpr std::string_view kMagic = "\x17\x08\x44tracing";
// Bounds (docs/trace-files.md): a decompressed metadata section, one decompressed chunk of
// CPU data, all chunks held at once, CPU streams per file.
inline constexpr uint64_t kMaxSection = 64ull << 20;
inline constexpr uint64_t kMaxChunk = 16ull << 20;
inline constexpr uint64_t kMaxLiveChunks = 512ull << 20;
inline constexpr size_t kMaxStreams = 8192;
inline constexpr uint64_t kMaxCpus = 8192;  // Linux's largest NR_CPUS (x86 MAXSMP)
inline constexpr size_t kPad =
    64;  // zeroed bytes after every page buffer: kbuffer reads up to 8 past

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

// Parses the file's layout into *out: magic, version, every section and option, each CPU's
// data range, all checked against the file's size. Errors name `path` and the offset.
Status ParseLayout(std::string_view file, const std::string& path, Layout* out);

// Parses "CPU: 0\n...overrun: N\n...read events: M\n" blocks; "Buffer: NAME" lines switch
// to an instance's CPUs.
std::vector<Layout::CpuStat> ParseCpuStats(std::string_view text);

// The libtraceevent sandbox (tracecmd_dat_sandbox.cc).
struct FormatFailure {
  uint64_t offset;
  std::string system;
  int error;
};
// The formats libtraceevent parses (indexes into L.formats): those of the events the kvm
// decoder reads (KvmDecoderReads: 14 kvm events and sched_switch), or, in a file with none,
// the first one (for the place of common_type). A capture holds every event format of its
// host (about 2400 on Linux 6.18: trace-cmd saves them all) and parsing one costs tens of
// microseconds, twice (the child, then this process): the others are only named, by
// ScanFormatHeader.
std::vector<size_t> FormatsToParse(const Layout& L);
// The name and id a format text declares in its header lines ("name: kvm_exit\nID: 1234\n",
// as the kernel writes them); false when it declares no name or no id.
bool ScanFormatHeader(std::string_view text, std::string_view* name, uint32_t* id) noexcept;
// Builds a tep_handle from the file's header page and the formats of FormatsToParse, as
// libtracecmd does with all of them. `progress` (when set) receives the file offset of each
// format before it is parsed.
tep_handle* BuildTep(const Layout& L, volatile uint64_t* progress,
                     std::vector<FormatFailure>* failures = nullptr);
// Parses those formats in a child process with capped memory and time first, so that a
// format that crashes or hangs libtraceevent is reported by offset instead.
Status ProbeFormatsInChild(const Layout& L, const std::string& path, uint64_t file_size);

}  // namespace dat
}  // namespace exitscope::sources
