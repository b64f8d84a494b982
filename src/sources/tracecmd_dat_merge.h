// sources/tracecmd_dat_merge.h: the inside of the .dat reader's CPU data (tracecmd_dat.h):
// each CPU stream read a batch at a time (StreamCursor; BatchPrefetch decompresses a stream's
// chunks on a thread), the streams merged in time order into the pairer (MergeRun), and the
// read in time segments on several threads (ReadInSegments). docs/trace-files.md says how and
// why. Not API.
#pragma once

extern "C" {
#include <traceevent/kbuffer.h>  // no extern "C" of its own
}

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/huge_pages.h"
#include "exitscope/status.h"
#include "sources/kvm_pairing.h"
#include "sources/kvm_trace.h"
#include "sources/ring_page.h"
#include "sources/tracecmd_dat_layout.h"

namespace exitscope::sources::dat {

// Validates a ring-buffer page before kbuffer reads it: the commit fits the page and every
// event header, walked exactly as kbuffer walks them, stays inside the commit. kbuffer
// trusts both (a bad commit or length makes it read outside the page or loop).
bool PageIsSane(const uint8_t* page, uint32_t page_size, uint32_t long_size, bool big,
                std::string* why);

// A run of one stream's pages and, once walked, their records in order, as the merge takes
// them: a chunk of a compressed stream (uncompressed: up to kMappedPages mapped pages). Items
// point into `base` (the chunk, or the mapped pages) by offset; a lost-event count has size
// kLost and the count in ts. Each item stands for at least 8 bytes of its page (a record's
// header and data), so a batch holds at most twice its pages' bytes in items: the chunk
// bound (kMaxLiveChunks) bounds them too.
struct Batch {
  static constexpr uint32_t kLost = UINT32_MAX;
  Batch() = default;
  // Buffers from arenas (BatchPool): memory that is written again rather than fresh.
  Batch(base::SlotArena* chunks, base::SlotArena* events)
      : items(base::SlotAllocator<RingEvent>(events)), chunk(base::SlotAllocator<uint8_t>(chunks)) {
    chunk.reserve(chunks->slot());
    items.reserve(events->slot() / sizeof(RingEvent));
  }
  std::vector<RingEvent, base::SlotAllocator<RingEvent>> items;
  // A compressed stream's decompressed chunk (+ kPad).
  std::vector<uint8_t, base::SlotAllocator<uint8_t>> chunk;
  const uint8_t* base = nullptr;
  uint64_t bytes = 0;   // of pages at base
  uint64_t offset = 0;  // in the file: the chunk's header, or the first mapped page
  uint64_t chunks = 0;  // what chunks_read() counts of it: 1 chunk, or its mapped pages
  uint64_t fast_pages = 0, checked_pages = 0;  // its pages by the path that walked them
  // After the items: 1 the stream goes on (the next batch), 0 it ends, -1 `error`.
  int after = 1;
  Status error;
};

// One CPU's data in one buffer, read a batch at a time: its records and lost-event counts in
// the order the single-threaded reader met them, then its end or error. Pages go through the
// fast walk (ring_page.h) when it is sure of them, else through PageIsSane and kbuffer. Owns
// no state shared with other streams but `live` (the single-threaded reader passes one
// counter for all; with threads, each side of a stream's BatchPrefetch counts its own). A
// compressed stream can start at any chunk (SeekChunk: reading in segments).
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
        offset_(offset),
        size_(size),
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

  // A cursor of the same stream at the stream's start, initialized (Init); null when it
  // cannot be.
  std::unique_ptr<StreamCursor> Fresh() const {
    auto c = std::make_unique<StreamCursor>(x_, cpu_, buffer_, compressed_, offset_, size_);
    return c->Init() ? std::move(c) : nullptr;
  }

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
    b->fast_pages = b->checked_pages = 0;
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
    b->fast_pages = b->checked_pages = 0;
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

  // This stream's largest decompressed chunk (+ kPad) and all its chunks' decompressed
  // bytes, read from the chunk headers up to the first one out of bounds (the read itself
  // reports that one).
  struct ChunkSizes {
    uint64_t largest = 0, total = 0;
  };
  ChunkSizes Sizes() const {
    ChunkSizes out;
    EachChunk([&](uint64_t, uint64_t usize) {
      if (usize > kMaxChunk || usize % x_.L->page_size != 0) return false;
      out.largest = std::max(out.largest, usize + kPad);
      out.total += usize;
      return true;
    });
    return out;
  }

  bool compressed() const { return compressed_; }

  // A compressed stream's chunk headers from here on (their offsets in the file), up to the
  // first one out of bounds.
  std::vector<uint64_t> ChunkOffsets() const {
    std::vector<uint64_t> out;
    EachChunk([&](uint64_t header, uint64_t) {
      out.push_back(header);
      return true;
    });
    return out;
  }
  // A compressed stream: reads on from the chunk whose header is at `header`, `left` chunks
  // before the stream's end (an offset ChunkOffsets gave at the stream's start).
  uint64_t chunks_left() const { return chunks_left_; }
  void SeekChunk(uint64_t header, uint64_t left) {
    pos_ = header;
    chunks_left_ = left;
  }

 private:
  // Calls f(header offset, decompressed size) for each chunk from here on while it returns
  // true, up to the first header out of bounds (a compressed stream; else none).
  template <class F>
  void EachChunk(F f) const {
    if (!compressed_) return;
    Bytes h(std::string_view(reinterpret_cast<const char*>(x_.map), x_.map_size), x_.L->big);
    uint64_t pos = pos_;
    for (uint64_t i = 0; i < chunks_left_; ++i) {
      h.Seek(pos);
      uint64_t csize = 0, usize = 0;
      if (!h.U(4, &csize) || !h.U(4, &usize) || csize > x_.map_size - h.offset()) return;
      if (!f(pos, usize)) return;
      pos = h.offset() + csize;
    }
  }
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
      ++b->checked_pages;
    } else {
      ++b->fast_pages;
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
  uint64_t offset_, size_;  // the stream's data in the file
  uint64_t pos_, end_;      // uncompressed: next page; compressed: next chunk header
  uint64_t chunks_left_ = 0;
  kbuffer* kbuf_ = nullptr;
  uint64_t last_offset_ = 0;
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

inline std::vector<StreamCursor*> RawCursors(const std::vector<std::unique_ptr<StreamCursor>>& v) {
  std::vector<StreamCursor*> out;
  for (const auto& c : v) out.push_back(c.get());
  return out;
}

// Batches kept for the runs of one read to reuse (from any thread): their buffers are
// written again rather than fresh memory, whose first touch of each page is a fault (about
// 10 us on these guests: docs/trace-files.md).
class BatchPool {
 public:
  // `largest`: the largest chunk (+ kPad) of the streams (ChunkSizes), which a batch's
  // buffers hold without growing.
  explicit BatchPool(uint64_t largest)
      : chunks_(std::min<uint64_t>(largest, kMaxSlot)),
        events_(std::min<uint64_t>(largest, kMaxSlot)) {}
  std::unique_ptr<Batch> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return std::make_unique<Batch>(&chunks_, &events_);
    std::unique_ptr<Batch> b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  void Put(std::unique_ptr<Batch> b) {
    if (!b) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < kMaxFree) free_.push_back(std::move(b));
  }

 private:
  static constexpr size_t kMaxFree = 64;
  static constexpr uint64_t kMaxSlot = 1 << 20;  // larger chunks: operator new
  base::SlotArena chunks_, events_;              // before free_: its batches go first
  std::mutex mu_;
  std::vector<std::unique_ptr<Batch>> free_;
};

// Where a stream stands in a merge: the batch it reads (by its offset in the file: a chunk's
// header, or its first mapped page) and the index of its next item there; or ended.
struct StreamPos {
  uint64_t batch = 0;
  uint64_t item = 0;
  bool ended = false;
  bool operator==(const StreamPos&) const = default;
};

// A place in the merged order, which is by (timestamp, stream index), as libtracecmd orders
// CPUs on ties. The default is no place: a run to the end.
struct MergeKey {
  unsigned long long ts = ~0ull;
  size_t stream = SIZE_MAX;
  bool none() const noexcept { return stream == SIZE_MAX; }
};

// What a read counts, summed over the runs that read its records in order.
struct ReadCounts {
  uint64_t read = 0;    // records
  uint64_t chunks = 0;  // chunks (compressed) or pages (mapped) loaded
  uint64_t fast_pages = 0, checked_pages = 0;
  std::vector<uint64_t> per_type;     // records by event id
  std::vector<uint64_t> per_stream;   // records by stream
  std::vector<uint64_t> last_offset;  // by stream: the last page walked (its chunk's, compressed)
  void Add(const ReadCounts& later, const ReadCounts& later_at_start);
};

// How records are told apart for the counts per event: common_type's place and size, and
// whether the capture's byte order is not this host's.
struct TypeField {
  int offset = -1;
  int size = 0;
  bool swap = false;
};
// Counts the record `data` (`size` bytes) under its event id in *per_type.
void CountType(const TypeField& f, const void* data, int size, std::vector<uint64_t>* per_type);

// The streams' records merged in time order, decoded and fed to a pairer, from where each
// stream's cursor stands. Lost-event counts go to the pairer as the merge passes them. A run
// can stop at a place in the merged order (Run's limit) and go on from there later.
class MergeRun {
 public:
  MergeRun(std::vector<StreamCursor*> streams, const Layout& L, const TypeField& type,
           KvmPairer* pairer, ReadCounts* counts);
  ~MergeRun();
  MergeRun(const MergeRun&) = delete;
  MergeRun& operator=(const MergeRun&) = delete;
  // Where new batches come from and go back to (not owned; it outlives the run).
  void SetPool(BatchPool* pool) { pool_ = pool; }
  // Where stream i's batches come from when not from its cursor: a thread (not owned).
  void SetPrefetch(size_t i, BatchPrefetch* p) { heads_[i].prefetch = p; }
  // Stream i's first batch, already loaded (its cursor past it).
  void SetFirstBatch(size_t i, std::unique_ptr<Batch> b) { heads_[i].preloaded = std::move(b); }
  // Told of every batch of pages loaded with its stream, file offset and first page.
  void SetSeen(void (*fn)(void*, size_t, uint64_t, const uint8_t*), void* ctx) {
    seen_ = fn;
    seen_ctx_ = ctx;
  }
  // Loads each stream's first batch. `at`: the place the merge goes on from, as Positions()
  // gave it (each cursor at that batch): the items before it are not passed again, and those
  // batches are not counted (the run that read the records before did). Null: from the
  // cursors' start, counted. false: an error (error()).
  bool Start(const std::vector<StreamPos>* at);
  // Feeds records in merged order to the end of the streams. false: an error (error()); the
  // records before it were fed.
  bool Run(KvmTepDecoder* decoder);
  // The same, up to where the batch of stream `stream` at file offset `offset` starts: the
  // limit is that batch's first page time stamp, learnt when the merge loads the batch, so
  // nothing is decompressed ahead to find it. (A batch without one: no limit, to the end.)
  bool RunToBatch(KvmTepDecoder* decoder, size_t stream, uint64_t offset);
  // Moves past the records below `limit` without feeding them (lost-event counts still go
  // to the pairer). false: an error (error()).
  bool Skip(MergeKey limit);
  // Where each stream stands (once Run stopped at its limit).
  std::vector<StreamPos> Positions() const;
  const Status& error() const { return error_; }
  KvmPairer* pairer() const { return pairer_; }
  // Goes on into another pairer and counts (where the run stopped, its batches loaded).
  void Rebind(KvmPairer* pairer, ReadCounts* counts) {
    pairer_ = pairer;
    counts_ = counts;
    counts_->per_stream.resize(heads_.size(), 0);
    counts_->last_offset.resize(heads_.size(), 0);
  }

 private:
  struct Head {
    std::unique_ptr<Batch> batch;
    std::unique_ptr<Batch> preloaded;  // SetFirstBatch
    BatchPrefetch* prefetch = nullptr;
    const RingEvent* cur = nullptr;
    const RingEvent* end = nullptr;
    unsigned long long ts = 0;  // *cur's, while `has`
    bool has = false;
  };
  std::unique_ptr<Batch> NewBatch() { return pool_ ? pool_->Get() : std::make_unique<Batch>(); }
  bool RunToLimit(KvmTepDecoder* decoder);  // Run and RunToBatch, to limit_
  bool Pull(size_t i);  // to stream i's next record (its next batch when one is used up)
  void Counted(size_t i, const Batch& b);
  uint64_t FixTs(unsigned long long ts) const {
    uint64_t t = ts + static_cast<uint64_t>(L_.ts_offset);
    if (L_.tsc2nsec) {
      t = static_cast<uint64_t>((static_cast<unsigned __int128>(t) * L_.tsc_mult) >> L_.tsc_shift) +
          L_.tsc_offset;
    }
    return t;
  }

  std::vector<StreamCursor*> streams_;
  const Layout& L_;
  TypeField type_;
  KvmPairer* pairer_;
  ReadCounts* counts_;
  std::vector<Head> heads_;
  static constexpr size_t kHeapFrom = 16;  // streams above which a heap picks the next one
  std::vector<std::pair<unsigned long long, size_t>> heap_;
  bool use_heap_ = false;
  KvmRecord rec_;      // reused: a record keeps the fields its event does not carry
  uint64_t live_ = 0;  // bytes of decompressed chunks held by the streams without a thread
  void (*seen_)(void*, size_t, uint64_t, const uint8_t*) = nullptr;
  void* seen_ctx_ = nullptr;
  BatchPool* pool_ = nullptr;
  MergeKey limit_;                 // where the run stops
  size_t stop_stream_ = SIZE_MAX;  // RunToBatch: the batch that sets limit_ when loaded
  uint64_t stop_offset_ = 0;
  bool limit_moved_ = false;  // set by Pull: the run re-reads limit_
  Status error_;
};

// Reading in time segments. The CPU data is cut in segments at chunks of its largest stream;
// threads read segments ahead, each with a pairer of its own that starts from nothing where
// the segment starts (KvmPairer::Arm: a thread's records are kept until two of its exits
// ended) and keeps the exits of its segment. The calling thread takes the segments in
// order: one a thread read counts only if that thread's pairer had, where the segment
// starts, the state this thread's has there, and its streams stood where this thread's run
// stopped; then its exits go to the sink, and its pairer goes on from the thread's read. Any
// other segment (none read yet, or a state that differs) this thread reads itself from where
// it stands. So the result is that of one thread, byte for byte, errors included.
struct SegmentOptions {
  uint64_t chunks = 0;   // of the largest stream per segment; 0: about kSegmentBytes of data
  unsigned workers = 1;  // threads besides the calling one
  uint64_t largest = 0;  // the streams' largest chunk (+ kPad): ChunkSizes
};
inline constexpr uint64_t kSegmentBytes = 256ull << 10;
// How far ahead of the calling thread the threads read: segments a thread has read and the
// calling thread has not taken yet are at most this many.
inline constexpr size_t SegmentWindow(unsigned workers) {
  return 2 * (size_t{workers} + 1) + 4;
}
struct SegmentReport {
  uint64_t segments = 0;
  uint64_t verified = 0;  // read by a thread and taken
};
// The most chunk memory a read in segments holds at once, `largest` bytes a chunk: every
// segment in the threads' window, and the calling thread's, with a batch per stream and one
// loaded ahead, twice (the walked records).
inline uint64_t SegmentsHeld(size_t streams, unsigned workers, uint64_t largest) {
  return (SegmentWindow(workers) + workers + 2) * (streams + 1) * largest * 2;
}
// Whether the streams can be read in segments: every one compressed, the file little endian.
bool SegmentsApply(const std::vector<std::unique_ptr<StreamCursor>>& streams, const Layout& L);
Status ReadInSegments(const std::vector<std::unique_ptr<StreamCursor>>& streams,
                      const StreamCursor::Ctx& ctx, const TypeField& type, KvmPairer* pairer,
                      KvmTepDecoder* decoder, const SegmentOptions& options, ReadCounts* counts,
                      uint64_t* short_records, SegmentReport* report);

}  // namespace exitscope::sources::dat
