// sources/tracefs_reader.h: reading a live trace buffer's raw per-CPU pages and decoding
// them into libtraceevent records.
//
// The kernel's ring buffer hands out whole sub-buffers ("pages", 4 KiB here) through
// per_cpu/cpuN/trace_pipe_raw, laid out as events/header_page says:
//
//   +-----------+-------------------+--------------------------------------------+
//   | timestamp | commit (+ flags)  | events: 4-byte header (type_len:5,         |
//   |  u64      |  local_t          |  time_delta:27) + payload, time extends,   |
//   |           |                   |  padding ... up to `commit` bytes          |
//   +-----------+-------------------+--------------------------------------------+
//
// Bit 31 of commit says events were lost before this page, bit 30 that their count is stored
// after the data. TracefsPageReader copies pages out, without parsing, as fast as the kernel
// fills them (non-blocking reads, polled by the caller, 10 ms is plenty: docs/host-facts.md).
// RawPageDecoder walks a page with libtraceevent's kbuffer and hands each event to a
// RecordSink as a `tep_record` (the type kvm-analysis's decoder adapter takes), counting lost
// events, never dropping them silently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "exitscope/status.h"

struct tep_handle;
struct tep_record;
struct kbuffer;

namespace exitscope::sources {

class TracefsSession;

class TracefsPageReader {
 public:
  // Opens per_cpu/cpuN/trace_pipe_raw of `buffer_dir` for every CPU.
  static Result<std::unique_ptr<TracefsPageReader>> Open(const std::string& buffer_dir, int cpus,
                                                         size_t page_size);
  static Result<std::unique_ptr<TracefsPageReader>> Open(const TracefsSession& session);
  ~TracefsPageReader();

  // Called once per page read; a page is always `page_size` bytes (zero filled after the data).
  using PageSink = std::function<Status(int cpu, const uint8_t* page, size_t size)>;

  // Reads every page available now on every CPU (at most `max_pages_per_cpu` each, so one
  // busy CPU cannot starve the others), without blocking. Returns the number of pages read.
  Result<size_t> Poll(const PageSink& sink, size_t max_pages_per_cpu = 256);

  // Closes the pipes (a private instance cannot be removed while they are open).
  void Close();

  size_t page_size() const { return page_size_; }
  int cpus() const { return static_cast<int>(fds_.size()); }
  uint64_t pages_read() const { return pages_read_; }

 private:
  TracefsPageReader() = default;
  std::string dir_;
  std::vector<int> fds_;
  size_t page_size_ = 4096;
  std::vector<uint8_t> page_;
  uint64_t pages_read_ = 0;
};

// Receives decoded records. `record` lives only for the call.
class RecordSink {
 public:
  virtual ~RecordSink() = default;
  virtual void OnRecord(tep_handle* tep, tep_record* record) = 0;
};

// Owns a tep_handle with the header page and the event formats of the given systems, read
// from a live tracefs or from a directory holding saved copies (events/header_page,
// events/SYSTEM/EVENT/format), with this host's endianness and long size.
class TepEvents {
 public:
  static Result<TepEvents> Load(const std::string& tracefs_dir,
                                const std::vector<std::string>& systems);
  TepEvents(TepEvents&& o) noexcept : tep_(o.tep_) { o.tep_ = nullptr; }
  TepEvents& operator=(TepEvents&& o) noexcept;
  ~TepEvents();
  tep_handle* get() const { return tep_; }

 private:
  explicit TepEvents(tep_handle* t) : tep_(t) {}
  tep_handle* tep_ = nullptr;
};

class RawPageDecoder {
 public:
  // `tep` supplies the header page layout (long size) and endianness; it must outlive this.
  explicit RawPageDecoder(tep_handle* tep);
  ~RawPageDecoder();
  RawPageDecoder(const RawPageDecoder&) = delete;
  RawPageDecoder& operator=(const RawPageDecoder&) = delete;

  // Decodes one page of `cpu`; returns the number of records given to `sink`. A page whose
  // header is malformed is counted in bad_pages() and skipped.
  size_t Decode(int cpu, const uint8_t* page, size_t size, RecordSink& sink);

  uint64_t records() const { return records_; }
  // Events the kernel reported lost (overwritten or dropped) before pages we decoded.
  uint64_t lost_events() const { return lost_events_; }
  // Pages preceded by a loss whose count the kernel could not store.
  uint64_t lost_unknown_pages() const { return lost_unknown_pages_; }
  uint64_t bad_pages() const { return bad_pages_; }

 private:
  tep_handle* tep_;
  kbuffer* kbuf_ = nullptr;
  uint64_t records_ = 0;
  uint64_t lost_events_ = 0;
  uint64_t lost_unknown_pages_ = 0;
  uint64_t bad_pages_ = 0;
};

}  // namespace exitscope::sources
