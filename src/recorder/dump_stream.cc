// Recorder::WriteDump: a dump written straight from the rings to the file (what WriteDump,
// es_write_dump and the dump signal use), without the in-memory Dump's exits or a string of
// the whole file: ring chunk (in cache) -> DumpExits (in cache) -> coded file records
// (exit_codec.h, a few bytes each instead of 60) -> CRC -> pwrite, on up to
// DumpOptions::threads threads that each take whole vCPUs. About 64 bytes of memory traffic
// per record read from the ring and 3-15 written to the page cache; per thread, a chunk and
// one vCPU's coded records.
//
// The file is that of SerializeDump (docs/dump-format.md: the other sections back to back in id
// order, then the exits), so every section but the exits must have its final size before the
// first record is written. Everything but the exits is therefore read first: metadata, address
// space, device events, findings, attributes, named counters, and each vCPU's in-progress exit
// together with its ring head h0. Numbers whose value is known only at the end (ring counters,
// exit counts, recorder counters) have fixed widths: those sections are serialised again at the
// end and written over their placeholders with the same layout.
//
// The in-progress exit E of a vCPU is read (after its ring head h0) before its ring is copied
// at head h1: first for all vCPUs (the layout), then again for each just before its copy (kept
// if it agrees: an exit in progress, or none; that makes the window one ring's copy). E may
// have ended and reached the ring in between, at an index j >= h0 (its record is written after
// the slot is cleared): ExitRing::FindStart finds it by its start, and the ring is copied up
// to j. That is the vCPU's state just before E ended, consistent, with the accounting exact
// (written = j). E is never both in progress and in the ring. If E's record was already
// overwritten (the vCPU wrote a whole ring's worth during the window), the ring is copied up
// to h1: E is shown in progress, as it was at h0, and every ring exit is later than it. An
// exit that began after its vCPU's slot was read is in the ring or not yet ended: it is simply
// not in this dump, as with Snapshot.
//
// A register map the layout did not know (an exit resolved in a generation whose range has
// since been removed, so its map is not among the current ranges') changes the sections
// before the exits: then the dump is taken again through Snapshot + WriteDumpFile.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <system_error>
#include <thread>
#include <vector>

#include "base/crc32.h"
#include "exitscope/recorder.h"
#include "recorder/dump_file.h"
#include "recorder/exit_convert.h"
#include "recorder/recorder_impl.h"

namespace exitscope {

using internal::DumpSections;
using internal::kExits;
using internal::kSectionCount;

namespace {

// One thread's coded vCPU: grown to the largest vCPU it codes, reused for the next.
class CodedVcpu {
 public:
  char* Reserve(size_t more) {
    if (cap_ - used_ < more) {
      const size_t cap = std::max(cap_ * 2, used_ + more);
      std::unique_ptr<char[]> grown(new char[cap]);
      if (used_ != 0) std::memcpy(grown.get(), bytes_.get(), used_);
      bytes_ = std::move(grown);
      cap_ = cap;
    }
    return bytes_.get() + used_;
  }
  void Commit(char* end) noexcept { used_ = static_cast<size_t>(end - bytes_.get()); }
  void Clear() noexcept { used_ = 0; }
  const char* data() const noexcept { return bytes_.get(); }
  size_t size() const noexcept { return used_; }

 private:
  std::unique_ptr<char[]> bytes_;
  size_t cap_ = 0, used_ = 0;
};

// The exits section as the coding threads hand it over: vCPU v's records go right after
// v - 1's, so each thread, its vCPU coded, waits for its turn to be given its offset, and then
// writes beside the others. The section's CRC is combined in vCPU order.
class ExitsInOrder {
 public:
  explicit ExitsInOrder(uint64_t first_offset) : next_offset_(first_offset) {}
  // vCPU `v`'s `n` bytes with CRC `crc`: returns their offset (after every earlier vCPU's).
  uint64_t Place(uint32_t v, size_t n, uint32_t crc) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return placed_ == v; });
    const uint64_t off = next_offset_;
    next_offset_ += n;
    crc_ = base::Crc32Combine(crc_, crc, n);
    bytes_ += n;
    ++placed_;
    lock.unlock();
    cv_.notify_all();
    return off;
  }
  void Fail(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_) status_ = std::move(s);
    failed_.store(true, std::memory_order_relaxed);
  }
  bool failed() const noexcept { return failed_.load(std::memory_order_relaxed); }
  // After every vCPU was placed (threads joined).
  Status status() const { return status_; }
  uint32_t crc() const noexcept { return crc_; }
  uint64_t bytes() const noexcept { return bytes_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t placed_ = 0;
  uint64_t next_offset_, bytes_ = 0;
  uint32_t crc_ = 0;
  Status status_;
  std::atomic<bool> failed_{false};
};

}  // namespace

Status Recorder::WriteDump(const std::string& path, const DumpOptions& options) const {
  bool fallback = false;
  {
    internal::DumpFile f;
    EXITSCOPE_RETURN_IF_ERROR(f.Open(path, internal::DumpFileOptions()));
    Dump d;  // everything but the exits
    std::map<const RegisterMap*, uint32_t> map_index;
    std::mutex maps_mu;  // d.maps and map_index, once the coding threads run
    SnapshotMetadata(options, &d, &map_index);
    const uint64_t now_ticks = clock_.Now();
    internal::ExitConverter convert(clock_, space_, options.include_guest_data, &d, &map_index);
    SnapshotEvents(&d);

    // Heads, then in-progress exits (that order: see above).
    std::vector<uint64_t> h0(num_vcpus_), in_progress_start(num_vcpus_, 0);
    uint64_t held = 0;
    for (uint32_t v = 0; v < num_vcpus_; ++v) {
      h0[v] = rings_.ring(v).written();
      held += std::min(h0[v], rings_.ring(v).capacity());
      ExitRecord cur;
      if (ReadInProgress(v, now_ticks, &cur)) {
        in_progress_start[v] = cur.start_ticks;
        convert(cur, &d.vcpus[v].in_progress.emplace());
      }
    }
    std::vector<uint64_t> counts(num_vcpus_, 0);
    DumpSections layout;
    internal::BuildSections(d, options, counts.data(), &layout);
    const size_t maps_known = d.maps.size();

    // The exits: threads take whole vCPUs in turn (an atomic counter), each copying its ring a
    // chunk at a time, converting the chunk into DumpExits and only then coding it (the
    // coder's wide loads of a DumpExit whose fields were just stored one by one would wait on
    // store forwarding), into its CodedVcpu; then ExitsInOrder gives it the offset and it
    // pwrites the vCPU. Memory: per thread a chunk and one vCPU's coded records (the rings'
    // 64 bytes a record become 3-15 here, at most kMaxCodedExit).
    ExitsInOrder placed(layout.offset[kExits] + 8);
    std::atomic<uint32_t> next_vcpu{0};
    std::atomic<bool> maps_grew{false};
    auto code_vcpus = [&]() noexcept {
      constexpr size_t kChunk = 512;  // 28 KiB of records, 32 KiB converted
      std::unique_ptr<ExitRecord[]> chunk;
      std::unique_ptr<DumpExit[]> converted;
      CodedVcpu coded;
      internal::ExitEncoder enc;
      internal::ExitConverter conv(clock_, space_, options.include_guest_data, &d, &map_index,
                                   &maps_mu);
      for (uint32_t v; (v = next_vcpu.fetch_add(1)) < num_vcpus_;) {
        coded.Clear();
        uint32_t crc = 0;
        // After a failure or a new map (the dump is then taken again: see above), the rest
        // is only placed, empty, so that no thread waits for a vCPU nobody codes.
        if (!placed.failed() && !maps_grew.load(std::memory_order_relaxed)) {
          try {
            if (!chunk) {
              chunk.reset(new ExitRecord[kChunk]);
              converted.reset(new DumpExit[kChunk]);
            }
            DumpVcpu& dv = d.vcpus[v];
            const ExitRing& ring = rings_.ring(v);
            // A fresh look just before the copy, kept if it agrees with the layout (an exit
            // in progress, or none): the window in which the exit can end and reach the ring
            // is then this ring's copy, not the whole dump.
            uint64_t from = h0[v], start = in_progress_start[v];
            const uint64_t fresh_head = ring.written();
            ExitRecord cur;
            const bool inside = ReadInProgress(v, clock_.Now(), &cur);
            if (inside == (start != 0)) {
              from = fresh_head;
              if (inside) {
                start = cur.start_ticks;
                conv(cur, &*dv.in_progress);
              }
            }
            uint64_t head = ring.written();
            if (start != 0) head = ring.FindStart(from, head, start);
            enc.NextVcpu();
            const ExitRing::SnapshotStats st =
                ring.SnapshotChunkedUpTo(head, options.max_exits_per_vcpu, chunk.get(), kChunk,
                                         [&](const ExitRecord* recs, size_t n) {
                                           for (size_t i = 0; i < n; ++i)
                                             conv(recs[i], &converted[i]);
                                           char* p = coded.Reserve(n * internal::kMaxCodedExit);
                                           for (size_t i = 0; i < n; ++i)
                                             p = enc.Put(converted[i], p);
                                           coded.Commit(p);
                                         });
            counts[v] = st.copied;
            dv.counters.capacity = ring.capacity();
            dv.counters.written = st.written;
            dv.counters.overwritten =
                st.written > ring.capacity() ? st.written - ring.capacity() : 0;
            dv.counters.skipped = ring.counters().skipped;
            {
              std::lock_guard<std::mutex> lock(maps_mu);
              if (d.maps.size() != maps_known) maps_grew.store(true, std::memory_order_relaxed);
            }
            crc = base::Crc32Extend(0, coded.data(), coded.size());
          } catch (const std::exception& e) {  // memory, most likely (std::bad_alloc)
            placed.Fail(Fail(ErrorCode::kInternal,
                             f.path() + ": coding vCPU " + std::to_string(v) + ": " + e.what()));
            coded.Clear();
          }
        }
        if (placed.failed() || maps_grew.load(std::memory_order_relaxed)) coded.Clear();
        const uint64_t off = placed.Place(v, coded.size(), crc);
        if (coded.size() != 0) {
          Status w = f.WriteAt(coded.data(), coded.size(), off);
          if (!w) placed.Fail(std::move(w));
        }
      }
    };
    uint32_t threads = options.threads;
    if (threads == 0) {
      threads = static_cast<uint32_t>(
          std::min<uint64_t>({std::max(1u, std::thread::hardware_concurrency()), 8,
                              std::max<uint64_t>(1, held >> 16)}));
    }
    threads = std::min(threads, num_vcpus_);
    std::vector<std::thread> helpers;
    for (uint32_t i = 1; i < threads; ++i) {
      try {
        helpers.emplace_back(code_vcpus);
      } catch (const std::system_error&) {
        break;  // fewer threads: the others take more vCPUs
      }
    }
    code_vcpus();
    for (std::thread& t : helpers) t.join();
    EXITSCOPE_RETURN_IF_ERROR(placed.status());
    d.counters = counters();

    DumpSections fin;
    if (d.maps.size() == maps_known) internal::BuildSections(d, options, counts.data(), &fin);
    for (uint32_t id = 1; id <= kSectionCount && !fallback; ++id) {
      fallback = d.maps.size() != maps_known || fin.offset[id] != layout.offset[id];
    }
    if (!fallback) {
      uint32_t crc[kSectionCount + 1] = {};
      char count[8];
      const uint64_t total = std::accumulate(counts.begin(), counts.end(), uint64_t{0});
      for (int i = 0; i < 8; ++i) count[i] = static_cast<char>(total >> (8 * i));
      EXITSCOPE_RETURN_IF_ERROR(f.WriteAt(count, 8, layout.offset[kExits]));
      crc[kExits] =
          base::Crc32Combine(base::Crc32Extend(0, count, 8), placed.crc(), placed.bytes());
      internal::SetExitsSize(&fin, 8 + placed.bytes());
      for (uint32_t id = 1; id <= kSectionCount; ++id) {
        if (id == kExits) continue;
        crc[id] = base::Crc32Of(fin.bytes[id]);
        EXITSCOPE_RETURN_IF_ERROR(
            f.WriteAt(fin.bytes[id].data(), fin.bytes[id].size(), fin.offset[id]));
      }
      const std::string head = internal::HeaderAndTable(fin, crc);
      EXITSCOPE_RETURN_IF_ERROR(f.WriteAt(head.data(), head.size(), 0));
      return f.Commit();
    }
  }  // the temporary file is removed here
  return WriteDumpFile(Snapshot(options), path, options);
}

}  // namespace exitscope
