// sources/tracecmd_dat_merge.cc: the CPU streams merged in time order (MergeRun) and the read
// in time segments on several threads (ReadInSegments). docs/trace-files.md.
#include "sources/tracecmd_dat_merge.h"

#include <bit>
#include <functional>

namespace exitscope::sources::dat {

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

void CountType(const TypeField& f, const void* data, int size, std::vector<uint64_t>* per_type) {
  if (f.offset < 0 || size < f.offset + f.size) return;
  const auto* p = static_cast<const uint8_t*>(data) + f.offset;
  uint32_t type = 0;
  if (f.size == 2) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    type = f.swap ? __builtin_bswap16(v) : v;
  } else if (f.size == 4) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    type = f.swap ? __builtin_bswap32(v) : v;
  } else if (f.size == 1) {
    type = *p;
  } else {
    return;
  }
  if (type >= per_type->size()) {
    if (type > 0xffff) return;  // not counted: no kernel gives such ids
    per_type->resize(type + 1, 0);
  }
  ++(*per_type)[type];
}

void ReadCounts::Add(const ReadCounts& later, const ReadCounts& at_start) {
  read += later.read - at_start.read;
  chunks += later.chunks - at_start.chunks;
  fast_pages += later.fast_pages - at_start.fast_pages;
  checked_pages += later.checked_pages - at_start.checked_pages;
  const auto add = [](std::vector<uint64_t>* to, const std::vector<uint64_t>& now,
                      const std::vector<uint64_t>& then) {
    if (to->size() < now.size()) to->resize(now.size(), 0);
    for (size_t i = 0; i < now.size(); ++i) (*to)[i] += now[i] - (i < then.size() ? then[i] : 0);
  };
  add(&per_type, later.per_type, at_start.per_type);
  add(&per_stream, later.per_stream, at_start.per_stream);
  if (last_offset.size() < later.last_offset.size()) last_offset.resize(later.last_offset.size());
  for (size_t i = 0; i < later.last_offset.size(); ++i) {
    if (later.last_offset[i] != 0) last_offset[i] = later.last_offset[i];
  }
}

MergeRun::MergeRun(std::vector<StreamCursor*> streams, const Layout& L, const TypeField& type,
                   KvmPairer* pairer, ReadCounts* counts)
    : streams_(std::move(streams)),
      L_(L),
      type_(type),
      pairer_(pairer),
      counts_(counts),
      heads_(streams_.size()) {
  counts_->per_stream.resize(streams_.size(), 0);
  counts_->last_offset.resize(streams_.size(), 0);
}

MergeRun::~MergeRun() {
  if (pool_ == nullptr) return;
  for (Head& h : heads_) {
    pool_->Put(std::move(h.batch));
    pool_->Put(std::move(h.preloaded));
  }
}

void MergeRun::Counted(size_t i, const Batch& b) {
  if (b.after == 1) counts_->chunks += b.chunks;
  counts_->fast_pages += b.fast_pages;
  counts_->checked_pages += b.checked_pages;
  if (streams_[i]->last_offset() != 0) counts_->last_offset[i] = streams_[i]->last_offset();
}

bool MergeRun::Pull(size_t i) {
  Head& h = heads_[i];
  for (;;) {
    for (; h.cur != h.end; ++h.cur) {
      if (h.cur->size != Batch::kLost) {
        h.ts = h.cur->ts;
        h.has = true;
        return true;
      }
      pairer_->OnLost(streams_[i]->cpu(), std::bit_cast<int64_t>(h.cur->ts));
    }
    if (h.batch && h.batch->after <= 0) {
      h.has = false;
      if (h.batch->after == 0) return true;
      error_ = h.batch->error;
      return false;
    }
    if (h.preloaded) {
      h.batch = std::move(h.preloaded);
    } else if (h.prefetch) {
      h.prefetch->Take(&h.batch);
    } else {
      if (!h.batch) h.batch = NewBatch();
      streams_[i]->Load(h.batch.get(), &live_);
    }
    if (h.batch->after == 1) {
      if (seen_ != nullptr && h.batch->bytes >= 8) {
        seen_(seen_ctx_, i, h.batch->offset, h.batch->base);
      }
      if (i == stop_stream_ && h.batch->offset == stop_offset_ && h.batch->bytes >= 8) {
        std::memcpy(&limit_.ts, h.batch->base, 8);  // the first page header's time stamp
        limit_.stream = i;
        limit_moved_ = true;
        stop_stream_ = SIZE_MAX;
      }
      streams_[i]->Walk(h.batch.get());
    }
    Counted(i, *h.batch);
    h.cur = h.batch->items.data();
    h.end = h.cur + h.batch->items.size();
  }
}

bool MergeRun::Start(const std::vector<StreamPos>* at) {
  for (size_t i = 0; i < heads_.size(); ++i) {
    if (at == nullptr) {
      if (!Pull(i)) return false;
      continue;
    }
    const StreamPos& p = (*at)[i];
    Head& h = heads_[i];
    if (p.ended) {
      h.has = false;
      continue;
    }
    // The batch the place is in: loaded and walked again, not counted again.
    if (!h.batch) h.batch = NewBatch();
    streams_[i]->Load(h.batch.get(), &live_);
    if (h.batch->after == 1) streams_[i]->Walk(h.batch.get());
    const size_t items = h.batch->items.size();
    h.cur = h.batch->items.data() + std::min<uint64_t>(p.item, items);
    h.end = h.batch->items.data() + items;
    if (!Pull(i)) return false;
  }
  if (heads_.size() > kHeapFrom) {
    use_heap_ = true;
    for (size_t i = 0; i < heads_.size(); ++i) {
      if (heads_[i].has) heap_.push_back({heads_[i].ts, i});
    }
    std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
  }
  return true;
}

std::vector<StreamPos> MergeRun::Positions() const {
  std::vector<StreamPos> out(heads_.size());
  for (size_t i = 0; i < heads_.size(); ++i) {
    const Head& h = heads_[i];
    if (!h.has) {
      out[i].ended = true;
    } else {
      out[i].batch = h.batch->offset;
      out[i].item = static_cast<uint64_t>(h.cur - h.batch->items.data());
    }
  }
  return out;
}

namespace {
// (ts, stream) before `limit` in the merged order.
bool Below(unsigned long long ts, size_t stream, const MergeKey& limit) {
  return ts < limit.ts || (ts == limit.ts && stream < limit.stream);
}
}  // namespace

bool MergeRun::Skip(MergeKey limit) {
  for (size_t i = 0; i < heads_.size(); ++i) {
    Head& h = heads_[i];
    while (h.has && Below(h.ts, i, limit)) {
      if (++h.cur != h.end && h.cur->size != Batch::kLost) {
        h.ts = h.cur->ts;
      } else if (!Pull(i)) {
        return false;
      }
    }
  }
  if (use_heap_) {
    heap_.clear();
    for (size_t i = 0; i < heads_.size(); ++i) {
      if (heads_[i].has) heap_.push_back({heads_[i].ts, i});
    }
    std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
  }
  return true;
}

bool MergeRun::Run(KvmTepDecoder* decoder) {
  limit_ = MergeKey{};
  stop_stream_ = SIZE_MAX;
  return RunToLimit(decoder);
}

bool MergeRun::RunToBatch(KvmTepDecoder* decoder, size_t stream, uint64_t offset) {
  limit_ = MergeKey{};
  stop_stream_ = stream;
  stop_offset_ = offset;
  const bool ok = RunToLimit(decoder);
  stop_stream_ = SIZE_MAX;
  return ok;
}

bool MergeRun::RunToLimit(KvmTepDecoder* decoder) {
  const MergeKey& limit = limit_;
  const size_t n = heads_.size();
  const bool count_u16 = type_.offset >= 0 && type_.size == 2 && !type_.swap;
  const uint32_t count_end = static_cast<uint32_t>(type_.offset + type_.size);
  std::vector<uint64_t>& per_type = counts_->per_type;
  uint64_t* const per_stream = counts_->per_stream.data();
  KvmRecord& rec = rec_;
  KvmRecord other;
  other.type = KvmEventType::kOther;
  uint64_t read = 0;
  for (;;) {
    // The stream with the lowest (timestamp, index) goes next, and its records keep going
    // while they stay below the next stream's (`bound`) and the limit: the merge picks a
    // stream once per run of records, not per record.
    size_t best = n, bound = n;
    limit_moved_ = false;
    if (use_heap_) {
      if (heap_.empty()) break;
      if (!limit.none() && !Below(heap_.front().first, heap_.front().second, limit)) break;
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
      best = heap_.back().second;
      heap_.pop_back();
      if (!heap_.empty()) bound = heap_.front().second;
    } else {
      for (size_t i = 0; i < n; ++i) {
        if (!heads_[i].has) continue;
        if (best == n || heads_[i].ts < heads_[best].ts) {
          bound = best;
          best = i;
        } else if (bound == n || heads_[i].ts < heads_[bound].ts) {
          bound = i;
        }
      }
      if (best == n) break;
      if (!limit.none() && !Below(heads_[best].ts, best, limit)) break;
    }
    unsigned long long bound_ts = bound < n ? heads_[bound].ts : ~0ull;
    if (!limit.none() && (bound == n || Below(limit.ts, limit.stream, {bound_ts, bound}))) {
      bound_ts = limit.ts;
      bound = limit.stream;
    }
    Head& c = heads_[best];
    const uint32_t cpu = streams_[best]->cpu();
    do {
      const uint64_t ts = FixTs(c.ts);
      const uint8_t* data = c.batch->base + c.cur->offset;
      const uint32_t size = c.cur->size;
      ++read;
      ++per_stream[best];
      if (count_u16 && size >= count_end) {  // the common layout: a little-endian u16 id
        uint16_t id;
        std::memcpy(&id, data + type_.offset, 2);
        if (id < per_type.size()) {
          ++per_type[id];
        } else {
          CountType(type_, data, static_cast<int>(size), &per_type);
        }
      } else {
        CountType(type_, data, static_cast<int>(size), &per_type);
      }
      // Every record is followed by at least kPad readable bytes (the rest of its page, then
      // the chunk's or the map's padding: see StreamCursor::Load), as DecodePadded needs.
      if (decoder->DecodePadded(data, size, ts, cpu, &rec)) {
        pairer_->Feed(rec);
      } else {
        other.ts = ts;
        other.cpu = cpu;
        pairer_->Feed(other);
      }
      if (++c.cur != c.end && c.cur->size != Batch::kLost) {
        c.ts = c.cur->ts;  // the next record of the same batch: what Pull would find
      } else if (!Pull(best)) {
        counts_->read += read;
        return false;
      }
    } while (c.has && (c.ts < bound_ts || (c.ts == bound_ts && best < bound)) && !limit_moved_);
    if (use_heap_ && c.has) {
      heap_.push_back({c.ts, best});
      std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    }
  }
  counts_->read += read;
  return true;
}

bool SegmentsApply(const std::vector<std::unique_ptr<StreamCursor>>& streams, const Layout& L) {
  if (streams.empty() || L.big) return false;
  for (const auto& s : streams) {
    // Every chunk header in bounds: a file cut short is read in order, which reports it.
    if (!s->compressed() || s->ChunkOffsets().size() != s->chunks_left()) return false;
  }
  return true;
}

namespace {

// One segment. A thread's read of it, when `ok`: where the streams stood where the segment
// starts and where it ended, the armed pairer (what it kept: KvmPairer::Arm), the counts.
struct Segment {
  enum class Stage : uint8_t { kFree, kMain, kRunning, kDone, kStolen };
  Stage stage = Stage::kFree;
  bool ok = false;
  std::vector<StreamPos> at_start, at_end;
  std::unique_ptr<KvmPairer> pairer;
  // The read where it stopped, for the calling thread to go on from without loading those
  // batches again.
  std::vector<std::unique_ptr<StreamCursor>> cursors;
  std::unique_ptr<MergeRun> run;
  ReadCounts counts;  // from the segment's start
  uint64_t short_records = 0;
};

// The timestamp of each chunk's first page, found by decompressing the chunk, once.
class ChunkTimes {
 public:
  ChunkTimes(const StreamCursor::Ctx& ctx, const std::vector<std::vector<uint64_t>>& offsets)
      : x_(ctx), offsets_(offsets) {
    for (const auto& o : offsets) ts_.emplace_back(o.size(), kUnknown);
  }
  // A chunk a read loaded (its header at `offset`, its first page at `page`): its time stamp,
  // known from now on without decompressing it again.
  static void Seen(void* self, size_t stream, uint64_t offset, const uint8_t* page) {
    auto* t = static_cast<ChunkTimes*>(self);
    const std::vector<uint64_t>& o = t->offsets_[stream];
    const auto it = std::lower_bound(o.begin(), o.end(), offset);
    if (it == o.end() || *it != offset) return;
    unsigned long long ts;
    std::memcpy(&ts, page, 8);
    std::lock_guard<std::mutex> lock(t->mu_);
    t->ts_[stream][static_cast<size_t>(it - o.begin())] = ts;
  }
  // false: the chunk does not decompress (the read in order reports it where it comes).
  bool Get(size_t stream, size_t chunk, unsigned long long* ts) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const unsigned long long t = ts_[stream][chunk];
      if (t == kFailed) return false;
      if (t != kUnknown) {
        *ts = t;
        return true;
      }
    }
    Bytes h(std::string_view(reinterpret_cast<const char*>(x_.map), x_.map_size), x_.L->big);
    h.Seek(offsets_[stream][chunk]);
    uint64_t csize = 0, usize = 0;
    thread_local std::vector<uint8_t> page;  // a chunk's worth, reused
    bool good = h.U(4, &csize) && h.U(4, &usize) && csize <= x_.map_size - h.offset() &&
                usize <= kMaxChunk && usize >= 8;
    if (good) {
      if (page.size() < usize) page.resize(usize);
      good = Codecs::Get().Decompress(x_.L->compression, x_.map + h.offset(), csize, page.data(),
                                      usize);
    }
    unsigned long long t = kFailed;
    if (good) std::memcpy(&t, page.data(), 8);  // the page header's time stamp (little endian)
    std::lock_guard<std::mutex> lock(mu_);
    ts_[stream][chunk] = good ? t : kFailed;
    *ts = t;
    return good;
  }

 private:
  static constexpr unsigned long long kUnknown = ~0ull, kFailed = ~0ull - 1;
  StreamCursor::Ctx x_;
  const std::vector<std::vector<uint64_t>>& offsets_;
  std::mutex mu_;
  std::vector<std::vector<unsigned long long>> ts_;
};

struct Plan {
  const std::vector<std::unique_ptr<StreamCursor>>& streams;
  const std::vector<std::vector<uint64_t>>& offsets;  // per stream: its chunks' headers
  const Layout& L;
  const TypeField& type;
  ChunkTimes& times;
  BatchPool& pool;
  size_t big = 0;    // the stream whose chunks cut the segments
  uint64_t per = 1;  // its chunks per segment
  size_t count = 1;  // segments

  // Cursors of every stream, each at chunk at[i] (ended when at[i] is its chunk count).
  std::vector<std::unique_ptr<StreamCursor>> Cursors(const std::vector<uint64_t>& at) const {
    std::vector<std::unique_ptr<StreamCursor>> out;
    for (size_t i = 0; i < streams.size(); ++i) {
      auto c = streams[i]->Fresh();
      if (!c) return {};
      const uint64_t n = offsets[i].size();
      c->SeekChunk(at[i] < n ? offsets[i][at[i]] : 0, n - std::min(at[i], n));
      out.push_back(std::move(c));
    }
    return out;
  }
  // A thread's read of segment s (s >= 1): its pairer starts from nothing where the segment
  // starts (the largest stream at the segment's first chunk, every other one at its last chunk
  // that starts before), armed there, and reads up to the next segment's start.
  void Read(size_t s, const KvmPairer& proto, const KvmPairer::Numbering& numbering,
            KvmPairer::SpecBuffer* buffer, const KvmTepDecoder& decoder, Segment* seg) const {
    // The segment's first chunk of the largest stream, loaded first: its first page's time
    // stamp is where the segment starts (and the read takes the chunk as it is).
    auto first_cursor = streams[big]->Fresh();
    if (!first_cursor) return;
    const uint64_t chunks = offsets[big].size();
    first_cursor->SeekChunk(offsets[big][s * per], chunks - s * per);
    auto first = pool.Get();
    uint64_t live = 0;
    first_cursor->Load(first.get(), &live);
    if (first->after != 1 || first->bytes < 8) {  // the calling thread meets it
      pool.Put(std::move(first));
      return;
    }
    MergeKey start;
    start.stream = big;
    std::memcpy(&start.ts, first->base, 8);
    ChunkTimes::Seen(&times, big, first->offset, first->base);
    std::vector<uint64_t> at(streams.size(), 0);
    for (size_t i = 0; i < streams.size(); ++i) {
      if (i == big) {
        at[i] = s * per;
        continue;
      }
      // The last chunk whose first page is before the start: every record of the chunks
      // before it is too (a CPU's time stamps only grow), so none of the segment's is skipped.
      uint64_t lo = 0, hi = offsets[i].size();  // answer in [lo, hi)
      while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        unsigned long long t = 0;
        if (!times.Get(i, mid, &t)) return;
        if (t < start.ts) {
          lo = mid;
        } else {
          hi = mid;
        }
      }
      at[i] = lo;
    }
    auto cursors = Cursors(at);
    if (cursors.empty()) return;
    cursors[big] = std::move(first_cursor);
    auto pairer = std::make_unique<KvmPairer>(proto.Fresh(numbering));
    KvmTepDecoder dec = decoder;
    ReadCounts counts;
    auto owned = std::make_unique<MergeRun>(RawCursors(cursors), L, type, pairer.get(), &counts);
    MergeRun& run = *owned;
    run.SetPool(&pool);
    run.SetFirstBatch(big, std::move(first));
    run.SetSeen(&ChunkTimes::Seen, &times);
    // What comes before the start is not fed: a thread's state there is the other pairer's
    // to give; this one meets every thread in the shadow (KvmPairer::Arm).
    if (!run.Start(nullptr) || !run.Skip(start)) return;
    seg->at_start = run.Positions();
    const ReadCounts counts_at_start = counts;
    const uint64_t short_at_start = dec.short_records();
    pairer->Arm(std::move(*buffer));
    if (!(s + 1 < count ? run.RunToBatch(&dec, big, offsets[big][(s + 1) * per]) : run.Run(&dec))) {
      *buffer = pairer->Disarm();  // for the next read
      return;
    }
    seg->at_end = run.Positions();
    seg->counts.Add(counts, counts_at_start);
    seg->short_records = dec.short_records() - short_at_start;
    seg->pairer = std::move(pairer);
    seg->cursors = std::move(cursors);
    seg->run = std::move(owned);
    seg->ok = true;
  }
};

}  // namespace

Status ReadInSegments(const std::vector<std::unique_ptr<StreamCursor>>& streams,
                      const StreamCursor::Ctx& ctx, const TypeField& type, KvmPairer* pairer,
                      KvmTepDecoder* decoder, const SegmentOptions& options, ReadCounts* counts,
                      uint64_t* short_records, SegmentReport* report) {
  const Layout& L = *ctx.L;
  std::vector<std::vector<uint64_t>> offsets;
  for (const auto& s : streams) offsets.push_back(s->ChunkOffsets());
  ChunkTimes times(ctx, offsets);
  // Before the segments and runs, which give their batches back to it.
  BatchPool pool(options.largest);
  Plan plan{streams, offsets, L, type, times, pool};
  for (size_t i = 0; i < streams.size(); ++i) {
    if (offsets[i].size() > offsets[plan.big].size()) plan.big = i;
  }
  const uint64_t chunks = offsets[plan.big].size();
  plan.per = options.chunks;
  if (plan.per == 0) {
    const uint64_t bytes = streams[plan.big]->Sizes().total;
    plan.per = std::max<uint64_t>(
        1, kSegmentBytes / std::max<uint64_t>(1, bytes / std::max<uint64_t>(chunks, 1)));
  }
  plan.count = std::max<uint64_t>(1, (chunks + plan.per - 1) / plan.per);
  report->segments = plan.count;

  const KvmPairer proto = pairer->Fresh({});
  const KvmTepDecoder proto_decoder =
      *decoder;                    // copied by the threads (this one counts in *decoder)
  KvmPairer::Numbering numbering;  // the calling thread's pairer's, as of its last segment
  std::deque<KvmPairer::SpecBuffer> buffers;  // storage of segments taken, for the next ones
  std::vector<Segment> segs(plan.count);
  // A wakeup is a system call, and on these guests a trip through the hypervisor: the calling
  // thread never waits, and wakes the threads only when they wait for work.
  std::mutex mu;
  std::condition_variable work_cv;
  size_t next = 0;  // the segment the calling thread takes next
  size_t idle = 0;  // threads waiting for work
  bool stop = false;

  // Threads take the furthest free segment within a window ahead of the calling thread (the
  // window bounds the exits held), so that it finds the next ones done when it gets there.
  const size_t window = SegmentWindow(options.workers);
  // Not the next few: the calling thread reaches them before a thread could end one, and then
  // reads it itself.
  const size_t near = 3;
  const auto work = [&] {
    KvmPairer::Numbering seed;
    KvmPairer::SpecBuffer buffer;
    for (;;) {
      size_t s = 0;
      {
        std::unique_lock<std::mutex> lock(mu);
        for (;;) {
          if (stop) return;
          bool any = false, found = false;
          // Not before the calling thread has read the first segment: the vCPU numbering the
          // threads start from is its pairer's as of then.
          if (next == 0) {
            ++idle;
            work_cv.wait(lock);
            --idle;
            continue;
          }
          for (size_t k = std::min(plan.count, next + window); k-- > next + near;) {
            if (segs[k].stage != Segment::Stage::kFree) continue;
            s = k;
            found = true;
            break;
          }
          if (found) break;
          for (size_t k = next + window; k < plan.count && !any; ++k) {
            any = segs[k].stage == Segment::Stage::kFree;
          }
          if (!any) return;  // none left beyond the window either
          ++idle;
          work_cv.wait(lock);
          --idle;
        }
        segs[s].stage = Segment::Stage::kRunning;
        seed = numbering;
        // A buffer given back (the oldest: the calling thread read the newest last, and
        // writing lines another core holds costs a trip to it each), else this thread's
        // own, or new.
        if (!buffer.has_storage() && !buffers.empty()) {
          buffer = std::move(buffers.front());
          buffers.pop_front();
        }
      }
      plan.Read(s, proto, seed, &buffer, proto_decoder, &segs[s]);
      std::lock_guard<std::mutex> lock(mu);
      if (segs[s].stage == Segment::Stage::kRunning) {
        segs[s].stage = Segment::Stage::kDone;
      } else {  // the calling thread read it meanwhile: nothing of it is used
        if (segs[s].pairer) buffer = segs[s].pairer->Disarm();
        segs[s] = Segment();
        segs[s].stage = Segment::Stage::kStolen;
      }
    }
  };
  std::vector<std::thread> threads;
  if (plan.count > 1) {
    for (unsigned i = 0; i < options.workers; ++i) threads.emplace_back(work);
  }
  const auto join = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    work_cv.notify_all();
    for (std::thread& t : threads) t.join();
  };

  // The calling thread: each segment in order, a thread's read of it taken when it fits.
  std::vector<StreamPos> pos;  // where the streams stand in the merged order
  std::vector<std::unique_ptr<StreamCursor>> own;
  std::unique_ptr<MergeRun> run;  // this thread's read, while it reads segments itself
  for (size_t s = 0; s < plan.count; ++s) {
    Segment& seg = segs[s];
    {
      std::unique_lock<std::mutex> lock(mu);
      // A segment a thread is still reading this thread reads too rather than wait: waiting
      // costs more than the read it would save (the thread's read is then not used).
      if (seg.stage == Segment::Stage::kFree) seg.stage = Segment::Stage::kMain;
      if (seg.stage == Segment::Stage::kRunning) seg.stage = Segment::Stage::kStolen;
    }
    const bool to_end = s + 1 >= plan.count;
    bool can = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      can = seg.stage == Segment::Stage::kDone;
    }
    can = can && seg.ok && seg.at_start == pos && pairer->CanTake(*seg.pairer);
    if (can) {
      KvmPairer::SpecBuffer storage = pairer->Take(std::move(*seg.pairer));
      std::lock_guard<std::mutex> lock(mu);
      buffers.push_back(std::move(storage));
      counts->Add(seg.counts, ReadCounts{});
      *short_records += seg.short_records;
      pos = seg.at_end;
      run = std::move(seg.run);  // this thread goes on from where the segment's read stopped
      own = std::move(seg.cursors);
      run->Rebind(pairer, counts);
      ++report->verified;
    } else {
      if (!run) {
        if (s == 0) {
          own = plan.Cursors(std::vector<uint64_t>(streams.size(), 0));
        } else {
          std::vector<uint64_t> at(streams.size());
          for (size_t i = 0; i < streams.size(); ++i) {
            const auto& o = offsets[i];
            at[i] = pos[i].ended
                        ? o.size()
                        : static_cast<uint64_t>(std::lower_bound(o.begin(), o.end(), pos[i].batch) -
                                                o.begin());
          }
          own = plan.Cursors(at);
        }
        if (own.empty()) {
          join();
          return Fail(ErrorCode::kInternal, "cannot allocate a kbuffer");
        }
        run = std::make_unique<MergeRun>(RawCursors(own), L, type, pairer, counts);
        run->SetPool(&pool);
        run->SetSeen(&ChunkTimes::Seen, &times);
        if (!run->Start(s == 0 ? nullptr : &pos)) {
          join();
          if (s != 0) pairer->Finish();
          return run->error();
        }
      }
      // To the next segment's start (the big stream's chunk there), or to the end.
      if (!(to_end ? run->Run(decoder)
                   : run->RunToBatch(decoder, plan.big, offsets[plan.big][(s + 1) * plan.per]))) {
        join();
        pairer->Finish();
        return run->error();
      }
      pos = run->Positions();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (seg.stage != Segment::Stage::kStolen) {  // done with: its memory goes, or is reused
        if (seg.pairer) {
          KvmPairer::SpecBuffer b = seg.pairer->Disarm();
          if (b.has_storage()) buffers.push_back(std::move(b));
        }
        seg = Segment();
      }
    }
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      next = s + 1;
      numbering = pairer->numbering();
      wake = idle > 0;
    }
    if (wake) work_cv.notify_all();
    if (to_end) break;
  }
  join();
  *short_records += decoder->short_records();
  pairer->Finish();
  return {};
}

}  // namespace exitscope::sources::dat
