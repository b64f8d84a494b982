#include "sources/tracecmd_dat.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <traceevent/event-parse.h>
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
#include "sources/tracecmd_dat_merge.h"

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
  if (const char* env = std::getenv("EXITSCOPE_DAT_SEGMENT_CHUNKS"); env != nullptr && *env) {
    dat->segment_chunks_ =
        std::string_view(env) == "auto" ? kAutoSegments : std::strtoull(env, nullptr, 10);
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
  CountType({type_offset_, type_size_, swap_}, data, size, &per_type_);
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
  const TypeField type{type_offset_, type_size_, swap_};
  ReadCounts counts;
  counts.per_type = std::move(per_type_);
  uint64_t short_records = 0;
  // Copies the counts out, whatever the read's outcome.
  const auto keep = [&] {
    records_read_ = counts.read;
    chunks_read_ = counts.chunks;
    fast_pages_ = counts.fast_pages;
    checked_pages_ = counts.checked_pages;
    per_type_ = std::move(counts.per_type);
  };
  // With several cores and at least kThreadedFrom bytes of decompressed CPU data (below
  // that, a read takes milliseconds and starting threads costs more than it saves), threads
  // read too, in one of two ways; either way the result is that of one thread:
  // - in time segments (ReadInSegments, docs/trace-files.md "Segments"), each read whole by
  //   one thread, when every stream is compressed and little endian and no record observer
  //   watches (the default);
  // - else one thread per compressed stream decompressing its chunks ahead (BatchPrefetch;
  //   this thread too, when it gets ahead) while this one walks, merges, decodes and pairs.
  // Uncompressed streams are mapped pages, walked here with no thread.
  // Chunk memory is bounded per file (kMaxLiveChunks): the threads run only when what they
  // can hold at once, every stream's largest chunk that many times, fits the bound (else the
  // single-threaded reader reports the file as before).
  const unsigned cores = std::thread::hardware_concurrency();
  uint64_t data = 0, held = 0, largest = 0;
  bool any = false;
  for (const auto& s : streams) {
    if (!s->compressed()) continue;
    any = true;
    const StreamCursor::ChunkSizes z = s->Sizes();
    data += z.total;
    held += z.largest * (BatchPrefetch::AheadFor(z.largest) + 2);
    largest = std::max(largest, z.largest);
  }
  const bool big = any && cores > 1 && data >= kThreadedFrom;
  const uint64_t budget = std::min<uint64_t>(kMaxLiveChunks, 4096 * map_size_);
  const unsigned workers =
      threads_ > 1 ? static_cast<unsigned>(threads_ - 1) : std::clamp(cores, 2u, 8u) - 1;
  // A number of chunks per segment asked for (tests) cuts segments whatever the size.
  const bool asked = segment_chunks_ > 0 && segment_chunks_ != kAutoSegments;
  segments_ = verified_segments_ = 0;
  if (threads_ != 1 && segment_chunks_ > 0 && (asked || threads_ > 1 || big) &&
      !pairer->has_observer() && SegmentsApply(streams, L) &&
      SegmentsHeld(streams.size(), workers, largest) <= budget) {
    SegmentReport report;
    Status s = ReadInSegments(
        streams, ctx, type, pairer, decoder,
        {.chunks = asked ? segment_chunks_ : 0, .workers = workers, .largest = largest}, &counts,
        &short_records, &report);
    read_threads_ = 1 + static_cast<int>(workers);
    segments_ = report.segments;
    verified_segments_ = report.verified;
    keep();
    if (!s) return s;
  } else {
    const bool threaded = any && (threads_ > 1 || (threads_ == 0 && big)) && held <= budget;
    MergeRun run(RawCursors(streams), L, type, pairer, &counts);
    std::vector<std::unique_ptr<BatchPrefetch>> prefetch;
    if (threaded) {
      for (size_t i = 0; i < streams.size(); ++i) {
        if (!streams[i]->compressed()) continue;
        prefetch.push_back(std::make_unique<BatchPrefetch>(
            streams[i].get(), BatchPrefetch::AheadFor(streams[i]->Sizes().largest)));
        run.SetPrefetch(i, prefetch.back().get());
        prefetch.back()->Start();
      }
    }
    read_threads_ = 1 + static_cast<int>(prefetch.size());
    const auto finish = [&] {
      for (auto& p : prefetch) p->Stop();
      keep();
    };
    if (!run.Start(nullptr)) {
      finish();
      return run.error();
    }
    if (!run.Run(decoder)) {
      finish();
      pairer->Finish();
      return run.error();
    }
    finish();
    pairer->Finish();
    short_records = decoder->short_records();
  }
  // A capture whose CPU data is cut short reads fewer records than the kernel handed to
  // trace-cmd (CPUSTAT "read events"): report where the data stops.
  for (const Layout::CpuStat& st : ParseCpuStats(L.cpustats)) {
    if (!st.has_read_events) continue;
    for (size_t i = 0; i < streams.size(); ++i) {
      const StreamCursor& s = *streams[i];
      if (L.buffers[s.buffer()].name == st.buffer && s.cpu() == st.cpu &&
          counts.per_stream[i] < st.read_events) {
        return Fail(ErrorCode::kCorrupt,
                    fmt::format("{}: offset {}: CPU {} data ends after {} of {} records "
                                "(truncated or corrupt file)",
                                path_, counts.last_offset[i], s.cpu(), counts.per_stream[i],
                                st.read_events));
      }
    }
  }
  if (short_records != 0) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}: {} kvm records shorter than their event format (corrupt "
                            "CPU data)",
                            path_, short_records));
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
