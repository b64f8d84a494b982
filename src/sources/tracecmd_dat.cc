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
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "base/clock_name.h"
#include "base/text.h"
#include "sources/host_tsc.h"
#include "sources/kvm_trace.h"
#include "sources/ring_page.h"
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

// A run of one stream's pages and, once walked, their records in order, as the merge takes
// them: a chunk of a compressed stream (uncompressed: up to kMappedPages mapped pages). Items
// point into `base` (the chunk, or the mapped pages) by offset; a lost-event count has size
// kLost and the count in ts. Each item stands for at least 8 bytes of its page (a record's
// header and data), so a batch holds at most twice its pages' bytes in items: the chunk
// bound (kMaxLiveChunks) bounds them too.
struct Batch {
  static constexpr uint32_t kLost = UINT32_MAX;
  std::vector<RingEvent> items;
  std::vector<uint8_t> chunk;  // a compressed stream's decompressed chunk (+ kPad)
  const uint8_t* base = nullptr;
  uint64_t bytes = 0;   // of pages at base
  uint64_t offset = 0;  // in the file: the chunk's header, or the first mapped page
  uint64_t chunks = 0;  // what chunks_read() counts of it: 1 chunk, or its mapped pages
  // After the items: 1 the stream goes on (the next batch), 0 it ends, -1 `error`.
  int after = 1;
  Status error;
};

// One CPU's data in one buffer, read a batch at a time: its records and lost-event counts in
// the order the single-threaded reader met them, then its end or error. Pages go through the
// fast walk (ring_page.h) when it is sure of them, else through PageIsSane and kbuffer. Owns
// no state shared with other streams but `live` (the single-threaded reader passes one
// counter for all; with threads, each side of a stream's BatchPrefetch counts its own).
class StreamCursor {
 public:
  struct Ctx {
    const std::string* path;
    const Layout* L;
    const uint8_t* map;
    uint64_t map_size;
    uint32_t lsize;
    bool fast;  // FastRingPagesApply and allowed
  };
  // Mapped (uncompressed) pages per batch.
  static constexpr uint32_t kMappedPages = 16;

  StreamCursor(const Ctx& ctx, uint32_t cpu, size_t buffer, bool compressed, uint64_t offset,
               uint64_t size)
      : x_(ctx),
        cpu_(cpu),
        buffer_(buffer),
        compressed_(compressed),
        pos_(offset),
        end_(offset + size) {
    if (compressed_) {
      Bytes h(std::string_view(reinterpret_cast<const char*>(x_.map), x_.map_size), x_.L->big);
      h.Seek(offset);
      h.U(4, &chunks_left_);  // checked at Open
      pos_ = offset + 4;
    }
  }
  ~StreamCursor() {
    if (kbuf_) kbuffer_free(kbuf_);
  }
  StreamCursor(const StreamCursor&) = delete;
  StreamCursor& operator=(const StreamCursor&) = delete;

  bool Init() {
    kbuf_ = kbuffer_alloc(x_.lsize == 8 ? KBUFFER_LSIZE_8 : KBUFFER_LSIZE_4,
                          x_.L->big ? KBUFFER_ENDIAN_BIG : KBUFFER_ENDIAN_LITTLE);
    return kbuf_ != nullptr;
  }

  // A compressed stream's next chunk, claimed: its header read and the cursor past it, the
  // data not yet decompressed (Decompress). result 1, 0 at the end, -1 a corrupt header.
  struct Claim {
    int result = 0;
    uint64_t header = 0, data = 0, csize = 0, usize = 0;
    Status error;
  };
  Claim ClaimChunk() {
    Claim c;
    if (chunks_left_ == 0) return c;
    Bytes h(std::string_view(reinterpret_cast<const char*>(x_.map), x_.map_size), x_.L->big);
    h.Seek(pos_);
    c.header = pos_;
    if (!h.U(4, &c.csize) || !h.U(4, &c.usize) || c.csize > x_.map_size - h.offset() ||
        c.usize > kMaxChunk || c.usize % x_.L->page_size != 0) {
      c.result = -1;
      c.error = Fail(ErrorCode::kCorrupt, fmt::format("{}: offset {}: corrupt CPU {} chunk header",
                                                      *x_.path, pos_, cpu_));
      chunks_left_ = 0;  // nothing after a corrupt header is read
      return c;
    }
    c.result = 1;
    c.data = h.offset();
    pos_ = c.data + c.csize;
    --chunks_left_;
    return c;
  }

  // Decompresses a claimed chunk into *b (its buffers reused; grown as needed, `live`
  // counting the growth against the bound): b->after 1, or 0 / -1 (b->error) as claimed or
  // when it does not decompress. Reads only the file and `c`: any thread may call it, for
  // chunks claimed in order.
  void Decompress(const Claim& c, Batch* b, uint64_t* live) const {
    b->items.clear();
    b->offset = c.header;
    b->bytes = 0;
    b->chunks = 0;
    b->after = c.result;
    if (c.result <= 0) {
      b->error = c.error;
      return;
    }
    const uint64_t need = c.usize + kPad;
    if (need > b->chunk.size()) {
      *live += need - b->chunk.size();
      const uint64_t budget = std::min<uint64_t>(kMaxLiveChunks, 4096 * x_.map_size);
      if (*live > budget) {
        b->after = -1;
        b->error = Fail(ErrorCode::kCorrupt,
                        fmt::format("{}: offset {}: corrupt file: CPU data chunks would hold "
                                    "{} bytes at once (limit {})",
                                    *x_.path, c.header, *live, budget));
        return;
      }
      b->chunk.resize(need);
    }
    b->base = b->chunk.data();
    std::memset(b->chunk.data() + c.usize, 0, kPad);
    if (!Codecs::Get().Decompress(x_.L->compression, x_.map + c.data, c.csize, b->chunk.data(),
                                  c.usize)) {
      b->after = -1;
      b->error = Fail(ErrorCode::kCorrupt,
                      fmt::format("{}: offset {}: corrupt file: CPU {} chunk does not "
                                  "decompress ({}, {} -> {} bytes)",
                                  *x_.path, c.header, cpu_, x_.L->compression, c.csize, c.usize));
      return;
    }
    b->bytes = c.usize;
    b->chunks = 1;
  }

  // The stream's next run of pages into *b (its buffers reused): a chunk claimed and
  // decompressed, or mapped pages; b->after 0 at the end, -1 on a corrupt chunk.
  void Load(Batch* b, uint64_t* live) {
    if (compressed_) {
      Decompress(ClaimChunk(), b, live);
      return;
    }
    const uint32_t page = x_.L->page_size;
    b->items.clear();
    b->after = 1;
    b->offset = pos_;
    b->bytes = 0;
    if (pos_ >= end_) {
      b->after = 0;
    } else if (pos_ + page + kPad > x_.map_size) {
      // The file's last page: copied, so that kbuffer's reads past it stay in memory.
      b->chunk.assign(page + kPad, 0);
      std::memcpy(b->chunk.data(), x_.map + pos_, page);
      b->base = b->chunk.data();
      b->bytes = page;
    } else {
      b->base = x_.map + pos_;
      while (b->bytes < uint64_t{kMappedPages} * page && pos_ + b->bytes < end_ &&
             pos_ + b->bytes + page + kPad <= x_.map_size) {
        b->bytes += page;
      }
    }
    pos_ += b->bytes;
    b->chunks = b->bytes / page;
  }

  // Walks the pages Load put in *b into its items, stopping at a corrupt page (b->after -1).
  // Called by the merge's thread only.
  void Walk(Batch* b) {
    const uint32_t page = x_.L->page_size;
    for (uint64_t at = 0; at < b->bytes; at += page) {
      if (!WalkPage(b, static_cast<uint32_t>(at), compressed_ ? b->offset : b->offset + at)) {
        return;
      }
    }
  }

  uint32_t cpu() const { return cpu_; }
  size_t buffer() const { return buffer_; }
  uint64_t last_offset() const { return last_offset_; }
  uint64_t fast_pages() const { return fast_pages_; }
  uint64_t checked_pages() const { return checked_pages_; }

  // This stream's largest decompressed chunk (+ kPad) and all its chunks' decompressed
  // bytes, read from the chunk headers up to the first one out of bounds (the read itself
  // reports that one).
  struct ChunkSizes {
    uint64_t largest = 0, total = 0;
  };
  ChunkSizes Sizes() const {
    ChunkSizes out;
    if (!compressed_) return out;
    Bytes h(std::string_view(reinterpret_cast<const char*>(x_.map), x_.map_size), x_.L->big);
    uint64_t pos = pos_;
    for (uint64_t i = 0; i < chunks_left_; ++i) {
      h.Seek(pos);
      uint64_t csize = 0, usize = 0;
      if (!h.U(4, &csize) || !h.U(4, &usize) || csize > x_.map_size - h.offset() ||
          usize > kMaxChunk || usize % x_.L->page_size != 0) {
        return out;
      }
      out.largest = std::max(out.largest, usize + kPad);
      out.total += usize;
      pos = h.offset() + csize;
    }
    return out;
  }

  bool compressed() const { return compressed_; }

 private:
  // Appends the page at b->base + at (from file offset `off`: the chunk's header, or the
  // page's) to b: its lost-event count first, then its records. false: a corrupt page
  // (b->after -1, b->error set).
  bool WalkPage(Batch* b, uint32_t at, uint64_t off) {
    const uint32_t page = x_.L->page_size;
    const uint8_t* p = b->base + at;
    last_offset_ = off;
    const size_t mark = b->items.size();
    const bool fast = x_.fast && WalkRingPageFast(p, page, at, &b->items);
    if (!fast) {
      b->items.resize(mark);
      std::string why;
      if (!PageIsSane(p, page, x_.lsize, x_.L->big, &why)) {
        b->error = Fail(ErrorCode::kCorrupt,
                        fmt::format("{}: offset {}: corrupt CPU {} data{}: {}", *x_.path, off, cpu_,
                                    compressed_ ? " (in the compressed chunk there)" : "", why));
        b->after = -1;
        return false;
      }
      ++checked_pages_;
    } else {
      ++fast_pages_;
    }
    kbuffer_load_subbuffer(kbuf_, const_cast<uint8_t*>(p));
    if (const int missed = kbuffer_missed_events(kbuf_); missed != 0) {
      b->items.insert(b->items.begin() + static_cast<ptrdiff_t>(mark),
                      RingEvent{0, Batch::kLost, std::bit_cast<uint64_t>(int64_t{missed})});
    }
    if (fast) return true;
    unsigned long long ts = 0;
    for (void* ev = kbuffer_read_event(kbuf_, &ts); ev != nullptr;
         ev = kbuffer_next_event(kbuf_, &ts)) {
      b->items.push_back({static_cast<uint32_t>(static_cast<const uint8_t*>(ev) - b->base),
                          static_cast<uint32_t>(kbuffer_event_size(kbuf_)), ts});
    }
    return true;
  }

  Ctx x_;
  uint32_t cpu_;
  size_t buffer_;
  bool compressed_;
  uint64_t pos_, end_;  // uncompressed: next page; compressed: next chunk header
  uint64_t chunks_left_ = 0;
  kbuffer* kbuf_ = nullptr;
  uint64_t last_offset_ = 0, fast_pages_ = 0, checked_pages_ = 0;
};

// Decompressed CPU data from which ReadOwn reads on threads by default.
constexpr uint64_t kThreadedFrom = 8ull << 20;

// Decompresses one compressed stream's chunks on a thread of its own, up to `ahead` chunks
// ahead of the merge, which takes them in order; when the next one is not claimed yet (the
// thread is still starting, or slower), the merge claims and decompresses it itself rather
// than wait. Chunks are claimed in order under the lock and decompressed outside it, so the
// pages, walked on the merge's thread, are the same in the same order: the result is that of
// one thread, and a chunk that fails is reported when the merge reaches it. Batches are
// recycled: at most ahead + 2 per stream exist at once. Both sides sleep rarely, as a wakeup
// costs microseconds (more in a guest): the thread fills until `ahead` are ready, then sleeps
// until the merge has taken half of them; the merge sleeps only for a chunk the thread is
// decompressing.
class BatchPrefetch {
 public:
  // Chunks ahead at most: kAheadBytes of the stream's largest chunk, within [2, kMaxAhead].
  // Small on purpose: the merge reads a chunk from the other core's cache, and the further
  // ahead the thread runs the further out that is (measured: the walk of the tiled capture
  // took 5.7 ms with 2 ahead, 6.3 ms with 8, 9.5 ms with 64; docs/trace-files.md).
  static constexpr uint64_t kAheadBytes = 512ull << 10;
  static constexpr uint64_t kMaxAhead = 8;
  static uint64_t AheadFor(uint64_t largest_chunk) {
    return std::clamp<uint64_t>(kAheadBytes / std::max<uint64_t>(largest_chunk, 1), 2, kMaxAhead);
  }

  BatchPrefetch(StreamCursor* cursor, uint64_t ahead)
      : cursor_(cursor), ahead_(ahead), low_(ahead / 2) {}
  ~BatchPrefetch() { Stop(); }
  BatchPrefetch(const BatchPrefetch&) = delete;
  BatchPrefetch& operator=(const BatchPrefetch&) = delete;

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  // Ends the thread (early: the merge stopped at an error) and waits for it.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    space_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  // The merge's side: the next chunk into *b (the one it read goes back to the thread).
  void Take(std::unique_ptr<Batch>* b) {
    std::unique_lock<std::mutex> lock(mu_);
    if (*b) free_.push_back(std::move(*b));
    const uint64_t want = taken_++;
    if (want == claimed_) {  // not claimed yet: decompress it here
      const StreamCursor::Claim c = Claim();
      *b = FreeBatch();
      lock.unlock();
      cursor_->Decompress(c, b->get(), &live_);
      return;
    }
    if (ready_.empty() || ready_.front().first != want) {
      taker_waits_ = true;
      ready_cv_.wait(lock, [&] { return !ready_.empty() && ready_.front().first == want; });
      taker_waits_ = false;
    }
    *b = std::move(ready_.front().second);
    ready_.pop_front();
    const bool wake = claimed_ - taken_ == low_;
    lock.unlock();
    if (wake) space_.notify_one();
  }

 private:
  // Under mu_: the next chunk's claim (in order), counted.
  StreamCursor::Claim Claim() {
    StreamCursor::Claim c = ended_ ? StreamCursor::Claim{} : cursor_->ClaimChunk();
    if (c.result <= 0) ended_ = true;
    ++claimed_;
    return c;
  }
  std::unique_ptr<Batch> FreeBatch() {
    if (free_.empty()) return std::make_unique<Batch>();
    std::unique_ptr<Batch> b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  void Run() {
    uint64_t live = 0;  // chunk bytes this thread grew (the sum was checked before starting)
    bool full = false;  // `ahead` were ahead: wait until the merge has taken half
    for (;;) {
      std::unique_ptr<Batch> b;
      StreamCursor::Claim c;
      uint64_t seq = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        space_.wait(lock, [&] {
          return stop_ || ended_ || claimed_ - taken_ < (full ? low_ + 1 : ahead_);
        });
        if (stop_ || ended_) return;
        seq = claimed_;
        c = Claim();
        b = FreeBatch();
      }
      cursor_->Decompress(c, b.get(), &live);
      bool wake = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        // Chunks finish in claim order: only this thread claims ahead of the merge.
        ready_.emplace_back(seq, std::move(b));
        full = claimed_ - taken_ >= ahead_;
        wake = taker_waits_;
      }
      if (wake) ready_cv_.notify_one();
    }
  }

  StreamCursor* cursor_;
  const uint64_t ahead_, low_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable ready_cv_;  // the merge waits for the chunk it takes next
  std::condition_variable space_;     // the thread waits for room
  // Chunks in claim order: claimed_ claimed (by either side), taken_ taken by the merge;
  // ready_: those the thread decompressed and the merge has not taken, by number.
  uint64_t claimed_ = 0, taken_ = 0;
  std::deque<std::pair<uint64_t, std::unique_ptr<Batch>>> ready_;
  std::vector<std::unique_ptr<Batch>> free_;
  uint64_t live_ = 0;   // chunk bytes the merge's side grew
  bool ended_ = false;  // the last claim was the end or an error: no more
  bool stop_ = false;
  bool taker_waits_ = false;
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
  // A kvm format the decoder reads that does not parse means a corrupt file; another one
  // (sched_switch, or the first format of a file without kvm events) leaves its event
  // undefined for the decoder, its records still counted by name (event_counts).
  for (const FormatFailure& f : failures) {
    if (f.system == "header_page") {
      return Fail(ErrorCode::kCorrupt,
                  fmt::format("{}: offset {}: corrupt file: the header_page format (the ring "
                              "buffer page layout) does not parse",
                              path, f.offset));
    }
    if (f.system != "kvm") continue;
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
  // Counters for every id a format declares (more are added if records hold others).
  for (const Layout::Format& f : L.formats) {
    if (f.declared && f.id <= 0xffff) {
      dat->declared_ids_ = std::max<size_t>(dat->declared_ids_, f.id + 1);
    }
  }
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
  // Overrides for comparing the readers on the command line (docs/trace-files.md).
  if (const char* env = std::getenv("EXITSCOPE_DAT_THREADS"); env != nullptr && *env) {
    dat->threads_ = std::atoi(env) > 0 ? std::atoi(env) : 0;
  }
  if (const char* env = std::getenv("EXITSCOPE_DAT_FAST"); env != nullptr && *env) {
    dat->allow_fast_ = std::string_view(env) != "0";
  }
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
    if (type > 0xffff) return;  // not counted: no kernel gives such ids
    per_type_.resize(type + 1, 0);
  }
  ++per_type_[type];
}

std::vector<DatEventCount> TraceCmdDat::event_counts() const {
  std::vector<DatEventCount> out;
  std::vector<std::pair<size_t, uint32_t>> unnamed;  // index into out, event id
  for (size_t id = 0; id < per_type_.size(); ++id) {
    if (per_type_[id] == 0) continue;
    tep_event* ev = tep_ ? tep_find_event(tep_, static_cast<int>(id)) : nullptr;
    if (ev != nullptr) {
      out.push_back({ev->system ? ev->system : "", ev->name ? ev->name : "", per_type_[id]});
    } else {
      unnamed.push_back({out.size(), static_cast<uint32_t>(id)});
      out.push_back({fmt::format("#{}", id), "unknown", per_type_[id]});
    }
  }
  // Events libtraceevent did not parse (dat::FormatsToParse) are named by their format's
  // header lines; an id no format declares stays "unknown".
  if (!unnamed.empty() && layout_) {
    std::unordered_map<uint32_t, const Layout::Format*> declared;
    for (const Layout::Format& f : layout_->formats) {
      if (f.declared) declared.try_emplace(f.id, &f);
    }
    for (const auto& [i, fid] : unnamed) {
      const auto it = declared.find(fid);
      if (it == declared.end()) continue;
      out[i].system = it->second->system;
      out[i].name = std::string(it->second->name);
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
  fast_pages_ = 0;
  checked_pages_ = 0;
  read_threads_ = 1;
  per_type_.assign(declared_ids_, 0);
  used_mapped_ = allow_mapped_;
  Status s = allow_mapped_ ? ReadOwn(pairer, &decoder) : ReadLibTraceCmd(pairer, nullptr);
  if (!s) return s;
  return {};
}

Status TraceCmdDat::ReadOwn(KvmPairer* pairer, KvmTepDecoder* decoder) {
  const Layout& L = *layout_;
  const int header_long = tep_get_header_page_size(tep_);
  const uint32_t lsize = header_long == 4 || (header_long <= 0 && L.long_size == 4) ? 4 : 8;
  const StreamCursor::Ctx ctx{&path_,    &L,    map_,
                              map_size_, lsize, allow_fast_ && FastRingPagesApply(L.big, lsize)};
  std::vector<std::unique_ptr<StreamCursor>> streams;
  for (size_t bi = 0; bi < L.buffers.size(); ++bi) {
    const Layout::Buffer& b = L.buffers[bi];
    for (const Layout::CpuData& c : b.cpus) {
      streams.push_back(
          std::make_unique<StreamCursor>(ctx, c.cpu, bi, b.compressed, c.offset, c.size));
    }
  }
  for (auto& s : streams) {
    if (!s->Init()) {
      return Fail(ErrorCode::kInternal, fmt::format("{}: cannot allocate a kbuffer", path_));
    }
  }
  // One thread per compressed stream (threads_ 0: when there are several cores and at least
  // kThreadedFrom bytes of decompressed CPU data: below that, a read takes milliseconds and
  // starting threads costs more than it saves). A stream's thread decompresses its chunks
  // (BatchPrefetch; this thread too, when it gets ahead); their pages are walked, and the
  // records merged, decoded and paired, on this thread, in the same order as without threads,
  // so the result is the same. Uncompressed streams are mapped pages, walked here with no
  // thread. Chunk memory is bounded per file
  // (kMaxLiveChunks): with threads a stream holds up to BatchPrefetch::AheadFor + 2 chunks at
  // once, so they run only when every stream's largest chunk, that many times, fits the
  // bound (else the single-threaded reader reports the file as before).
  bool threaded = false;
  if (threads_ != 1) {
    const unsigned cores = std::thread::hardware_concurrency();
    uint64_t data = 0, held = 0;
    bool any = false;
    for (const auto& s : streams) {
      if (!s->compressed()) continue;
      any = true;
      const StreamCursor::ChunkSizes z = s->Sizes();
      data += z.total;
      held += z.largest * (BatchPrefetch::AheadFor(z.largest) + 2);
    }
    threaded = any && (threads_ > 1 || (cores > 1 && data >= kThreadedFrom)) &&
               held <= std::min<uint64_t>(kMaxLiveChunks, 4096 * map_size_);
  }
  // Each stream's place in the merge: its current batch and the next item in it.
  struct Head {
    std::unique_ptr<Batch> batch;
    std::unique_ptr<BatchPrefetch> prefetch;  // threaded: where its batches come from
    const RingEvent* cur = nullptr;
    const RingEvent* end = nullptr;
    unsigned long long ts = 0;  // *cur's, while `has`
    bool has = false;
    uint64_t count = 0;  // records fed
  };
  std::vector<Head> heads(streams.size());
  int threads = 0;
  if (threaded) {
    for (size_t i = 0; i < streams.size(); ++i) {
      if (!streams[i]->compressed()) continue;
      heads[i].prefetch = std::make_unique<BatchPrefetch>(
          streams[i].get(), BatchPrefetch::AheadFor(streams[i]->Sizes().largest));
      heads[i].prefetch->Start();
      ++threads;
    }
  }
  read_threads_ = 1 + threads;
  // Totals of the streams; the threads are stopped first (their cursors' counters are theirs
  // until then).
  const auto finish = [&] {
    for (Head& h : heads) {
      if (h.prefetch) h.prefetch->Stop();
    }
    for (const auto& s : streams) {
      fast_pages_ += s->fast_pages();
      checked_pages_ += s->checked_pages();
    }
  };
  uint64_t live = 0;  // bytes of decompressed chunks held by all streams (single thread)
  Status error;
  // Moves stream `i` to its next record, passing lost-event counts to the pairer on the way
  // and taking its next batch when one is used up. false: an error (in `error`).
  const auto pull = [&](size_t i) -> bool {
    Head& h = heads[i];
    for (;;) {
      for (; h.cur != h.end; ++h.cur) {
        if (h.cur->size != Batch::kLost) {
          h.ts = h.cur->ts;
          h.has = true;
          return true;
        }
        pairer->OnLost(streams[i]->cpu(), std::bit_cast<int64_t>(h.cur->ts));
      }
      if (h.batch && h.batch->after <= 0) {
        h.has = false;
        if (h.batch->after == 0) return true;
        error = h.batch->error;
        return false;
      }
      if (h.prefetch) {
        h.prefetch->Take(&h.batch);
      } else {
        if (!h.batch) h.batch = std::make_unique<Batch>();
        streams[i]->Load(h.batch.get(), &live);
      }
      if (h.batch->after == 1) {
        chunks_read_ += h.batch->chunks;
        streams[i]->Walk(h.batch.get());
      }
      h.cur = h.batch->items.data();
      h.end = h.cur + h.batch->items.size();
    }
  };
  const auto fix_ts = [&](unsigned long long ts) -> uint64_t {
    uint64_t t = ts + static_cast<uint64_t>(L.ts_offset);
    if (L.tsc2nsec) {
      t = static_cast<uint64_t>((static_cast<unsigned __int128>(t) * L.tsc_mult) >> L.tsc_shift) +
          L.tsc_offset;
    }
    return t;
  };
  for (size_t i = 0; i < streams.size(); ++i) {
    if (!pull(i)) {
      finish();
      return error;
    }
  }
  // Merge by timestamp, the lowest stream index first on ties (as libtracecmd does per CPU).
  using Key = std::pair<unsigned long long, size_t>;
  std::vector<Key> heap;
  const bool use_heap = streams.size() > 16;
  if (use_heap) {
    for (size_t i = 0; i < streams.size(); ++i) {
      if (heads[i].has) heap.push_back({heads[i].ts, i});
    }
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
  }
  const bool count_u16 = type_offset_ >= 0 && type_size_ == 2 && !swap_;
  const uint32_t count_end = static_cast<uint32_t>(type_offset_ + type_size_);
  KvmRecord rec;
  KvmRecord other;
  other.type = KvmEventType::kOther;
  uint64_t read = 0;
  const size_t n = streams.size();
  for (;;) {
    // The stream with the lowest (timestamp, index) goes next, and its records keep going
    // while they stay below the next stream's (`bound`): the merge picks a stream once per
    // run of records, not per record.
    size_t best = n, bound = n;
    if (use_heap) {
      if (heap.empty()) break;
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      best = heap.back().second;
      heap.pop_back();
      if (!heap.empty()) bound = heap.front().second;
    } else {
      for (size_t i = 0; i < n; ++i) {
        if (!heads[i].has) continue;
        if (best == n || heads[i].ts < heads[best].ts) {
          bound = best;
          best = i;
        } else if (bound == n || heads[i].ts < heads[bound].ts) {
          bound = i;
        }
      }
      if (best == n) break;
    }
    const unsigned long long bound_ts = bound < n ? heads[bound].ts : ~0ull;
    Head& c = heads[best];
    const uint32_t cpu = streams[best]->cpu();
    do {
      const uint64_t ts = fix_ts(c.ts);
      const uint8_t* data = c.batch->base + c.cur->offset;
      const uint32_t size = c.cur->size;
      ++read;
      ++c.count;
      if (count_u16 && size >= count_end) {  // the common layout: a little-endian u16 id
        uint16_t id;
        std::memcpy(&id, data + type_offset_, 2);
        if (id < per_type_.size()) {
          ++per_type_[id];
        } else {
          Count(data, static_cast<int>(size));
        }
      } else {
        Count(data, static_cast<int>(size));
      }
      // Every record is followed by at least kPad readable bytes (the rest of its page, then
      // the chunk's or the map's padding: see StreamCursor::Load), as DecodePadded needs.
      if (decoder->DecodePadded(data, size, ts, cpu, &rec)) {
        pairer->Feed(rec);
      } else {
        other.ts = ts;
        other.cpu = cpu;
        pairer->Feed(other);
      }
      if (++c.cur != c.end && c.cur->size != Batch::kLost) {
        c.ts = c.cur->ts;  // the next record of the same batch: what pull would find
      } else if (!pull(best)) {
        records_read_ = read;
        finish();
        pairer->Finish();
        return error;
      }
    } while (c.has && (c.ts < bound_ts || (c.ts == bound_ts && best < bound)));
    if (use_heap && c.has) {
      heap.push_back({c.ts, best});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  }
  records_read_ = read;
  finish();
  pairer->Finish();
  // A capture whose CPU data is cut short reads fewer records than the kernel handed to
  // trace-cmd (CPUSTAT "read events"): report where the data stops.
  for (const Layout::CpuStat& st : ParseCpuStats(L.cpustats)) {
    if (!st.has_read_events) continue;
    for (size_t i = 0; i < streams.size(); ++i) {
      const StreamCursor& s = *streams[i];
      if (L.buffers[s.buffer()].name == st.buffer && s.cpu() == st.cpu &&
          heads[i].count < st.read_events) {
        return Fail(ErrorCode::kCorrupt,
                    fmt::format("{}: offset {}: CPU {} data ends after {} of {} records "
                                "(truncated or corrupt file)",
                                path_, s.last_offset(), s.cpu(), heads[i].count, st.read_events));
      }
    }
  }
  if (decoder->short_records() != 0) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: {} kvm records shorter than their event format (corrupt "
                            "CPU data)",
                            path_, decoder->short_records()));
  }
  return {};
}

Status TraceCmdDat::LoadPagesOnly(uint64_t* pages, uint64_t* checksum) {
  const Layout& L = *layout_;
  const StreamCursor::Ctx ctx{&path_, &L, map_, map_size_, 8, false};
  *pages = 0;
  *checksum = 0;
  uint64_t live = 0;
  for (size_t bi = 0; bi < L.buffers.size(); ++bi) {
    const Layout::Buffer& b = L.buffers[bi];
    for (const Layout::CpuData& c : b.cpus) {
      StreamCursor s(ctx, c.cpu, bi, b.compressed, c.offset, c.size);
      Batch batch;
      for (;;) {
        s.Load(&batch, &live);
        if (batch.after < 0) return batch.error;
        if (batch.after == 0) break;
        for (uint64_t at = 0; at < batch.bytes; at += L.page_size) {
          const uint8_t* p = batch.base + at;
          ++*pages;
          // Uncompressed pages are only mapped: read them (a word per cache line) so that the
          // floor includes bringing them in; a decompressed page was just written.
          if (!b.compressed) {
            for (uint32_t i = 0; i + 8 <= L.page_size; i += 64) {
              uint64_t v;
              std::memcpy(&v, p + i, 8);
              *checksum ^= v;
            }
          } else {
            *checksum += p[0];
          }
        }
      }
    }
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
