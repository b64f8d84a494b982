// Recorder::WriteDump: a dump written straight from the rings to the file (what WriteDump,
// es_write_dump and the dump signal use), without the in-memory Dump's exits or a string of
// the whole file: ring chunk (in cache) -> coded file records in a block (in cache;
// exit_codec.h, a few bytes each instead of 60) -> CRC -> pwrite. About 64 bytes of memory
// traffic per record read from the ring and 5-15 written to the page cache, and no fresh pages
// but the file's.
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
#include <map>
#include <memory>
#include <vector>

#include "exitscope/recorder.h"
#include "recorder/dump_file.h"
#include "recorder/exit_convert.h"
#include "recorder/recorder_impl.h"

namespace exitscope {

using internal::DumpSections;
using internal::kExits;
using internal::kSectionCount;

Status Recorder::WriteDump(const std::string& path, const DumpOptions& options) const {
  bool fallback = false;
  {
    internal::DumpFile f;
    EXITSCOPE_RETURN_IF_ERROR(f.Open(path));
    Dump d;  // everything but the exits
    std::map<const RegisterMap*, uint32_t> map_index;
    SnapshotMetadata(options, &d, &map_index);
    const uint64_t now_ticks = clock_.Now();
    internal::ExitConverter convert(clock_, space_, options.include_guest_data, &d, &map_index);
    SnapshotEvents(&d);

    // Heads, then in-progress exits (that order: see above).
    std::vector<uint64_t> h0(num_vcpus_), in_progress_start(num_vcpus_, 0);
    for (uint32_t v = 0; v < num_vcpus_; ++v) {
      h0[v] = rings_.ring(v).written();
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

    internal::ExitStream exits(&f, layout.offset[kExits], layout.guest);
    constexpr size_t kChunk = 512;  // 28 KiB of records
    const std::unique_ptr<ExitRecord[]> chunk(new ExitRecord[kChunk]);
    for (uint32_t v = 0; v < num_vcpus_ && d.maps.size() == maps_known; ++v) {
      DumpVcpu& dv = d.vcpus[v];
      const ExitRing& ring = rings_.ring(v);
      // A fresh look just before the copy, kept if it agrees with the layout (an exit in
      // progress, or none): the window in which the exit can end and reach the ring is then
      // this ring's copy, not the whole dump.
      uint64_t from = h0[v], start = in_progress_start[v];
      const uint64_t fresh_head = ring.written();
      ExitRecord cur;
      const bool inside = ReadInProgress(v, clock_.Now(), &cur);
      if (inside == (start != 0)) {
        from = fresh_head;
        if (inside) {
          start = cur.start_ticks;
          convert(cur, &*dv.in_progress);
        }
      }
      uint64_t head = ring.written();
      if (start != 0) head = ring.FindStart(from, head, start);
      exits.NextVcpu();
      const ExitRing::SnapshotStats st =
          ring.SnapshotChunkedUpTo(head, options.max_exits_per_vcpu, chunk.get(), kChunk,
                                   [&](const ExitRecord* recs, size_t n) {
                                     for (size_t i = 0; i < n; ++i) {
                                       DumpExit e;
                                       convert(recs[i], &e);
                                       exits.Add(e);
                                     }
                                   });
      counts[v] = st.copied;
      dv.counters.capacity = ring.capacity();
      dv.counters.written = st.written;
      dv.counters.overwritten = st.written > ring.capacity() ? st.written - ring.capacity() : 0;
      dv.counters.skipped = ring.counters().skipped;
    }
    d.counters = counters();

    DumpSections fin;
    if (d.maps.size() == maps_known) internal::BuildSections(d, options, counts.data(), &fin);
    for (uint32_t id = 1; id <= kSectionCount && !fallback; ++id) {
      fallback = d.maps.size() != maps_known || fin.offset[id] != layout.offset[id];
    }
    if (!fallback) {
      uint32_t crc[kSectionCount + 1] = {};
      uint64_t bytes = 0;
      EXITSCOPE_RETURN_IF_ERROR(exits.Finish(&crc[kExits], &bytes));
      internal::SetExitsSize(&fin, bytes);
      for (uint32_t id = 1; id <= kSectionCount; ++id) {
        if (id == kExits) continue;
        crc[id] = internal::Crc32Of(fin.bytes[id]);
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
