// sources/tracefs_reader.cc: see tracefs_reader.h.
#include "sources/tracefs_reader.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "fmt/format.h"
#include "sources/tracefs_session.h"

extern "C" {
#include <event-parse.h>
#include <kbuffer.h>
}

namespace exitscope::sources {

Result<std::unique_ptr<TracefsPageReader>> TracefsPageReader::Open(const std::string& buffer_dir,
                                                                   int cpus, size_t page_size) {
  if (cpus <= 0 || page_size < 64) {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: no per-CPU buffers to read", buffer_dir));
  }
  std::unique_ptr<TracefsPageReader> r(new TracefsPageReader());
  r->dir_ = buffer_dir;
  r->page_size_ = page_size;
  r->page_.resize(page_size);
  for (int cpu = 0; cpu < cpus; ++cpu) {
    const std::string path = fmt::format("{}/per_cpu/cpu{}/trace_pipe_raw", buffer_dir, cpu);
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT) {  // a CPU that is not possible on this machine: keep the index
        r->fds_.push_back(-1);
        continue;
      }
      return Fail(err == EACCES || err == EPERM ? ErrorCode::kPermission : ErrorCode::kIo,
                  fmt::format("{}: cannot open: {}", path, std::strerror(err)));
    }
    r->fds_.push_back(fd);
  }
  return r;
}

Result<std::unique_ptr<TracefsPageReader>> TracefsPageReader::Open(const TracefsSession& s) {
  return Open(s.buffer_dir(), s.cpu_count(), s.subbuf_size());
}

TracefsPageReader::~TracefsPageReader() {
  Close();
}

void TracefsPageReader::Close() {
  for (int& fd : fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

Result<size_t> TracefsPageReader::Poll(const PageSink& sink, size_t max_pages_per_cpu) {
  size_t pages = 0;
  for (size_t cpu = 0; cpu < fds_.size(); ++cpu) {
    if (fds_[cpu] < 0) continue;
    for (size_t i = 0; i < max_pages_per_cpu; ++i) {
      const ssize_t n = ::read(fds_[cpu], page_.data(), page_size_);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return Fail(ErrorCode::kIo, fmt::format("{}/per_cpu/cpu{}/trace_pipe_raw: read failed: {}",
                                                dir_, cpu, std::strerror(errno)));
      }
      if (n == 0) break;
      if (static_cast<size_t>(n) < page_size_) {
        std::memset(page_.data() + n, 0, page_size_ - static_cast<size_t>(n));
      }
      ++pages;
      ++pages_read_;
      if (Status st = sink(static_cast<int>(cpu), page_.data(), page_size_); !st) {
        return Propagate(st);
      }
    }
  }
  return pages;
}

// ---------------------------------------------------------------------------------------------

Result<TepEvents> TepEvents::Load(const std::string& tracefs_dir,
                                  const std::vector<std::string>& systems) {
  // Parsed from the format files directly (not tracefs_local_events_system): the same code
  // then reads a live tracefs and a directory of saved format files.
  tep_handle* tep = tep_alloc();
  if (!tep) return Fail(ErrorCode::kInternal, "out of memory allocating a tep handle");
  TepEvents out(tep);
  const tep_endian host =
      std::endian::native == std::endian::big ? TEP_BIG_ENDIAN : TEP_LITTLE_ENDIAN;
  tep_set_file_bigendian(tep, host);
  tep_set_local_bigendian(tep, host);
  tep_set_long_size(tep, static_cast<int>(sizeof(long)));
  tep_set_page_size(tep, static_cast<int>(::sysconf(_SC_PAGESIZE)));
  auto header = ReadTracefsFile(tracefs_dir + "/events/header_page");
  if (!header) return Propagate(header);
  if (tep_parse_header_page(tep, header->data(), header->size(), static_cast<int>(sizeof(long))) !=
      0) {
    return Fail(ErrorCode::kCorrupt,
                fmt::format("{}/events/header_page: cannot parse", tracefs_dir));
  }
  for (const std::string& sys : systems) {
    const std::string sysdir = tracefs_dir + "/events/" + sys;
    DIR* d = ::opendir(sysdir.c_str());
    if (!d) {
      return Fail(ErrorCode::kNotFound,
                  fmt::format("{}: cannot list event formats: {}", sysdir, std::strerror(errno)));
    }
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    ::closedir(d);
    for (const std::string& ev : names) {
      const std::string path = sysdir + "/" + ev + "/format";
      if (::access(path.c_str(), R_OK) != 0) continue;  // "enable", "filter": not events
      auto text = ReadTracefsFile(path);
      if (!text) return Propagate(text);
      // A format libtraceevent cannot parse (an exotic print fmt) still defines its fields:
      // tep keeps the event with a warning, so only a missing event is an error.
      (void)tep_parse_event(tep, text->data(), text->size(), sys.c_str());
    }
  }
  return out;
}

TepEvents& TepEvents::operator=(TepEvents&& o) noexcept {
  if (this != &o) {
    if (tep_) tep_free(tep_);
    tep_ = o.tep_;
    o.tep_ = nullptr;
  }
  return *this;
}

TepEvents::~TepEvents() {
  if (tep_) tep_free(tep_);
}

RawPageDecoder::RawPageDecoder(tep_handle* tep) : tep_(tep) {
  const enum kbuffer_long_size lsize =
      tep_get_header_page_size(tep) == 4 ? KBUFFER_LSIZE_4 : KBUFFER_LSIZE_8;
  const enum kbuffer_endian endian =
      tep_is_file_bigendian(tep) ? KBUFFER_ENDIAN_BIG : KBUFFER_ENDIAN_LITTLE;
  kbuf_ = kbuffer_alloc(lsize, endian);
}

RawPageDecoder::~RawPageDecoder() {
  if (kbuf_) kbuffer_free(kbuf_);
}

size_t RawPageDecoder::Decode(int cpu, const uint8_t* page, size_t size, RecordSink& sink) {
  const size_t lsize = tep_get_header_page_size(tep_) == 4 ? 4 : 8;
  const size_t header = 8 + lsize;
  if (!kbuf_ || size < header) {
    ++bad_pages_;
    return 0;
  }
  uint64_t commit = 0;
  std::memcpy(&commit, page + 8, lsize);  // host endian: pages come from this kernel
  const uint64_t data_len = commit & ((uint64_t{1} << 27) - 1);
  if (data_len > size - header) {
    ++bad_pages_;
    return 0;
  }
  if (data_len == 0) return 0;
  // kbuffer does not modify the page; its API is not const.
  if (kbuffer_load_subbuffer(kbuf_, const_cast<uint8_t*>(page)) < 0) {
    ++bad_pages_;
    return 0;
  }
  const int missed = kbuffer_missed_events(kbuf_);
  if (missed > 0) lost_events_ += static_cast<uint64_t>(missed);
  if (missed < 0) ++lost_unknown_pages_;

  size_t n = 0;
  unsigned long long ts = 0;
  bool first = true;
  for (void* data = kbuffer_read_event(kbuf_, &ts); data; data = kbuffer_next_event(kbuf_, &ts)) {
    tep_record rec;
    std::memset(&rec, 0, sizeof rec);
    rec.ts = ts;
    rec.cpu = cpu;
    rec.data = data;
    rec.size = kbuffer_event_size(kbuf_);
    rec.record_size = kbuffer_curr_size(kbuf_);
    rec.offset = static_cast<unsigned long long>(kbuffer_curr_offset(kbuf_));
    rec.missed_events = first ? missed : 0;
    rec.locked = 1;  // not ours to free
    first = false;
    sink.OnRecord(tep_, &rec);
    ++n;
  }
  records_ += n;
  return n;
}

}  // namespace exitscope::sources
