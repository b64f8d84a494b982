// sources/tracecmd_dat.h: reads kvm records from a trace-cmd .dat file (versions 6 and 7,
// uncompressed or compressed with zstd or zlib, one or many buffers).
//
//   auto dat = TraceCmdDat::Open("trace.dat");          // validates the whole layout
//   if (!dat) { puts(dat.error().message.c_str()); }     // "trace.dat: offset 4096: ..."
//   KvmPairer pairer({.clock = ScaleFor((*dat)->clock())}, &sink);
//   Status s = (*dat)->ReadAll(&pairer);                 // time order over all CPUs
//
// The file is parsed here, not by libtracecmd (which crashes, double-frees or allocates
// without bound on corrupt files): every length, offset and count is checked against the
// real file size before anything is read or allocated. libtraceevent still parses the event
// format texts (to decode fields); it is first run on them in a child process, so a format
// it crashes on becomes one error line instead of taking this process down. Compressed CPU
// data is decompressed one chunk at a time per CPU. Limits: docs/trace-files.md.
//
// Ring-buffer pages take one of two paths. The fast path (ring_page.h) walks a page itself,
// bounds-checking every header, and hands each record's bytes to the decoder: no kbuffer
// call per record, no name lookup, string compare or allocation. Any page it is not sure of
// (big-endian or 4-byte-long layout, a long record, an absolute time stamp, a discarded
// record, anything crossing a bound) takes the checked path instead: PageIsSane (commit,
// every event header) and then libtraceevent's kbuffer. Both give the same records (tested
// on every committed .dat, fuzzed). With several cores, each compressed CPU stream is
// decompressed on a thread of its own, a few chunks ahead; the pages are walked and the
// records merged, decoded and paired on the calling thread in the same order as with one
// thread, so the result is the same byte for byte.
//
// Records are decoded with KvmTepDecoder (field offsets looked up once per event type)
// straight from the pages: no per-event object is built. Lost events (kbuffer's missed-events
// count) are passed to the pairer; the per-CPU overrun counts the file carries (CPUSTAT option) are
// reported in lost_at_record_time().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exitscope/status.h"
#include "sources/kvm_pairing.h"
#include "sources/kvm_trace.h"

struct tracecmd_input;
struct tep_handle;

namespace exitscope::sources {

// True when the file starts with trace-cmd's magic ("\x17\x08\x44tracing").
bool LooksLikeTraceCmdDat(std::string_view head) noexcept;

// Records of one event (system:name) in a file.
struct DatEventCount {
  std::string system;
  std::string name;
  uint64_t count = 0;
};

class TraceCmdDat {
 public:
  // Opens and validates `path`: magic, version, every section, option, CPU data range and
  // compressed chunk header (a truncated capture is refused with the offset where data is
  // missing), and the event formats (parsed in a child process first).
  static Result<std::unique_ptr<TraceCmdDat>> Open(const std::string& path);
  ~TraceCmdDat();
  TraceCmdDat(const TraceCmdDat&) = delete;
  TraceCmdDat& operator=(const TraceCmdDat&) = delete;

  // The trace clock the capture used ("x86-tsc", "local", ...); "local" when the file
  // does not say.
  const std::string& clock() const noexcept { return clock_; }
  // CPUs of the traced host (CPUCOUNT option, else the highest CPU with data + 1).
  int cpus() const noexcept { return cpus_; }
  // File version (6 or 7) and compression ("none", "zstd", "zlib").
  int version() const noexcept { return version_; }
  const std::string& compression() const noexcept { return compression_; }
  // Overruns the kernel reported per CPU when the capture was taken (CPUSTAT "overrun:"),
  // summed: events lost before they reached the file.
  uint64_t lost_at_record_time() const noexcept { return lost_at_record_; }

  // Streams every record of every buffer, in time order across CPUs, into `pairer` and
  // calls Finish(). Records of other events are counted by the pairer as
  // KvmEventType::kOther.
  Status ReadAll(KvmPairer* pairer);
  // true (default): ReadAll uses this reader. false: it uses libtracecmd's iterator instead
  // (top buffer only, no isolation from libtracecmd's crashes): a reference for tests.
  void set_mapped_reader(bool allow) noexcept { allow_mapped_ = allow; }
  bool used_mapped_reader() const noexcept { return used_mapped_; }
  // Records seen by the last ReadAll, kvm or not.
  uint64_t records_read() const noexcept { return records_read_; }
  // Records per event seen by the last ReadAll (events with no record left out), sorted by
  // system and name. An event id no format defines is named "unknown" with system "#<id>".
  std::vector<DatEventCount> event_counts() const;
  // CPU data chunks (compressed files) or pages (uncompressed) the last ReadAll walked.
  uint64_t chunks_read() const noexcept { return chunks_read_; }

  // true (default): pages the fast walk is sure of (ring_page.h) are read without kbuffer;
  // false: every page goes through the checked path (PageIsSane, then kbuffer). The
  // environment variable EXITSCOPE_DAT_FAST=0 sets false at Open.
  void set_fast_decode(bool allow) noexcept { allow_fast_ = allow; }
  // Pages the last ReadAll read by the fast walk and by the checked path.
  uint64_t fast_pages() const noexcept { return fast_pages_; }
  uint64_t checked_pages() const noexcept { return checked_pages_; }
  // Reading threads: 0 (default) when the host has several cores and the compressed streams
  // hold at least 8 MiB of decompressed data, one per core but this one (up to 7) reading
  // segments, or one decompressing thread per compressed CPU stream where segments do not
  // apply (see set_segment_chunks); 1 none; N > 1 threads even on one core (tests): N - 1
  // reading segments, or one decompressing per compressed stream. Uncompressed streams
  // (mapped pages) never get one. The result is the same either way.
  // EXITSCOPE_DAT_THREADS=N sets it at Open.
  void set_read_threads(int n) noexcept { threads_ = n < 0 ? 0 : n; }
  // Threads the last ReadAll read with: this one plus its decompressing threads, or plus
  // the threads that read segments.
  int read_threads() const noexcept { return read_threads_; }
  // Reading in time segments on threads (docs/trace-files.md "Segments"): kAutoSegments
  // (default) about 256 KiB of decompressed data a segment, when the threads read at all (see
  // set_read_threads); n chunks of the largest stream a segment, with threads whatever the
  // size (tests: 1 cuts the most segments); 0 never (the decompressing threads instead).
  // Applies when every stream is compressed and little endian and the pairer has no record
  // observer. EXITSCOPE_DAT_SEGMENT_CHUNKS=n (or =auto) sets it at Open. The result is the
  // same either way.
  static constexpr uint64_t kAutoSegments = ~uint64_t{0};
  void set_segment_chunks(uint64_t n) noexcept { segment_chunks_ = n; }
  // Segments the last ReadAll cut (0: it read without), and how many of them a thread read
  // and this one took (the others it read itself: see the doc).
  uint64_t segments() const noexcept { return segments_; }
  uint64_t verified_segments() const noexcept { return verified_segments_; }

  // The floor no reader goes below, for the benchmark (bench/kvm_dat_floor_benchmark.cc):
  // every CPU data page loaded (chunks decompressed, uncompressed pages read), on this thread,
  // and nothing else. *pages: how many; *checksum: a value from their bytes.
  Status LoadPagesOnly(uint64_t* pages, uint64_t* checksum);

  struct Layout;  // the parsed file (tracecmd_dat.cc)

 private:
  TraceCmdDat() = default;
  Status ReadOwn(KvmPairer* pairer, KvmTepDecoder* decoder);
  Status ReadLibTraceCmd(KvmPairer* pairer, KvmTepDecoder* decoder);
  void Count(const void* data, int size) noexcept;
  bool allow_mapped_ = true;
  bool used_mapped_ = false;
  bool allow_fast_ = true;
  int threads_ = 0;
  int read_threads_ = 1;
  uint64_t segment_chunks_ = kAutoSegments;
  uint64_t segments_ = 0, verified_segments_ = 0;
  uint64_t fast_pages_ = 0;
  uint64_t checked_pages_ = 0;
  std::string path_;
  std::unique_ptr<Layout> layout_;
  const uint8_t* map_ = nullptr;
  uint64_t map_size_ = 0;
  tep_handle* tep_ = nullptr;
  std::string clock_ = "local";
  std::string compression_ = "none";
  int version_ = 0;
  int cpus_ = 0;
  uint64_t lost_at_record_ = 0;
  uint64_t records_read_ = 0;
  uint64_t chunks_read_ = 0;
  int type_offset_ = -1;
  int type_size_ = 0;
  bool swap_ = false;
  size_t declared_ids_ = 0;         // the largest id a format declares + 1
  std::vector<uint64_t> per_type_;  // records per event id (ids up to 0xffff)
};

}  // namespace exitscope::sources
