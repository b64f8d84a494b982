// Dump writer: SerializeDump (the binary format of docs/dump-format.md: header, section table,
// sections, CRC32 per section) and WriteDumpFile (atomic replace of a regular file).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "base/crc32.h"
#include "exitscope/dump.h"
#include "recorder/dump_file.h"
#include "recorder/dump_format.h"
#include "recorder/exit_codec.h"

namespace exitscope {

using namespace internal;  // dump_format.h

namespace {

// Little-endian appender.
class Writer {
 public:
  void U8(uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Le(v, 2); }
  void U32(uint32_t v) { Le(v, 4); }
  void U64(uint64_t v) { Le(v, 8); }
  void I64(int64_t v) { Le(static_cast<uint64_t>(v), 8); }
  void F64(double v) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    U64(u);
  }
  std::string& buf() { return buf_; }

 private:
  void Le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string buf_;
};

class Strings {
 public:
  void Ref(Writer& w, std::string_view s) {
    auto it = index_.find(std::string(s));
    uint32_t off;
    if (it == index_.end()) {
      off = static_cast<uint32_t>(data_.size());
      data_.append(s);
      index_.emplace(std::string(s), off);
    } else {
      off = it->second;
    }
    w.U32(off);
    w.U32(static_cast<uint32_t>(s.size()));
  }
  const std::string& data() const { return data_; }

 private:
  std::string data_;
  std::unordered_map<std::string, uint32_t> index_;
};

void PutExit(Writer& w, const DumpExit& e, bool guest_data) {
  w.U64(e.start_ns);
  w.U64(e.duration_ns);
  w.U64(e.addr);
  w.U64(guest_data ? e.value : 0);
  w.U32(e.vcpu);
  w.U32(e.device);
  w.U32(e.reg);
  w.U32(e.reg_element);
  w.U32(e.reg_delta);
  w.U8(static_cast<uint8_t>(e.kind));
  w.U8(e.size);
  w.U8(static_cast<uint8_t>(e.dir));
  w.U8(guest_data ? e.flags : static_cast<uint8_t>(e.flags & ~kExitFlagValue));
  w.U32(e.map);  // since version 2
}

// A finding's stack is stored when a capture was made or a note says why none was.
bool HasStack(const ThreadStack& s) {
  return !s.empty() || !s.note.empty();
}

void PutLe(char* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

namespace {
void SerializeInto(const Dump& d, const DumpOptions& opts, std::string* out, bool headroom);
}  // namespace

std::string SerializeDump(const Dump& d, const DumpOptions& opts) {
  std::string out;
  SerializeInto(d, opts, &out, false);
  return out;
}

// A string kept for dump after dump grows with headroom, so that the next dump (a few records
// more or fewer) fits in the pages it already has.
void SerializeDump(const Dump& d, const DumpOptions& opts, std::string* out) {
  SerializeInto(d, opts, out, true);
}

namespace internal {

void BuildSections(const Dump& d, const DumpOptions& opts, const uint64_t* exit_counts,
                   DumpSections* out) {
  const bool guest = opts.include_guest_data && d.includes_guest_data;
  out->guest = guest;
  Strings strings;
  Writer sec[kSectionCount + 1];

  {  // meta
    Writer& w = sec[kMeta];
    w.U64(d.monotonic_ns);
    w.U64(d.realtime_ns);
    w.U8(static_cast<uint8_t>(d.clock.source));
    w.U8(d.clock.tsc_invariant ? 1 : 0);
    w.U8(d.clock.tsc_known_freq ? 1 : 0);
    w.U8(0);
    w.F64(d.clock.ns_per_tick);
    w.U64(d.clock.tsc_hz);
    w.U64(d.clock.base_ticks);
    w.U64(d.clock.base_ns);
    w.U64(d.slow_exit_threshold_ns);
    w.U64(d.watchdog.stuck_exit_ns);
    w.U64(d.watchdog.io_age_ns);
    w.U64(d.watchdog.poll_ns);
    w.U8(d.watchdog_running ? 1 : 0);
    w.I64(d.process.pid);
    strings.Ref(w, d.process.comm);
    w.U32(static_cast<uint32_t>(d.process.argv.size()));
    for (const std::string& a : d.process.argv) strings.Ref(w, a);
    w.U64(d.process.start_realtime_ns);
    for (const std::string* s : {&d.host.sysname, &d.host.nodename, &d.host.release,
                                 &d.host.version, &d.host.machine, &d.host.cpu_model}) {
      strings.Ref(w, *s);
    }
    w.U32(d.host.cpus);
    const RecorderCounters& c = d.counters;
    for (uint64_t v :
         {c.bad_vcpu, c.end_without_begin, c.begin_without_end, c.slow_exits, c.findings_dropped,
          c.io_inflight_overflow, c.io_untracked_completions, c.io_in_flight}) {
      w.U64(v);
    }
    const DeviceEventCounters& e = d.device_event_counters;
    for (uint64_t v : {e.capacity, e.written, e.overwritten, e.dropped, e.skipped}) w.U64(v);
    w.U32(static_cast<uint32_t>(d.attributes.size()));
    for (const auto& [k, v] : d.attributes) {
      strings.Ref(w, k);
      strings.Ref(w, v);
    }
  }
  {
    Writer& w = sec[kDevices];
    w.U32(static_cast<uint32_t>(d.devices.size()));
    for (const DeviceInfo& dev : d.devices) {
      w.U32(dev.index);
      w.U64(dev.id);
      strings.Ref(w, dev.name);
      strings.Ref(w, dev.kind);
    }
  }
  {
    Writer& w = sec[kMaps];
    w.U32(static_cast<uint32_t>(d.maps.size()));
    for (const RegisterMap& m : d.maps) {
      strings.Ref(w, m.name());
      w.U32(static_cast<uint32_t>(m.registers().size()));
      for (const RegisterDef& r : m.registers()) {
        strings.Ref(w, r.name);
        w.U64(r.offset);
        w.U32(r.width);
        w.U8(static_cast<uint8_t>(r.access));
        w.U8(r.alias ? 1 : 0);
        w.U16(0);
        w.U32(r.count);
        w.U64(r.stride);
        strings.Ref(w, r.description);
      }
    }
  }
  {
    Writer& w = sec[kRanges];
    w.U32(static_cast<uint32_t>(d.ranges.size()));
    for (const DumpRange& r : d.ranges) {
      w.U8(static_cast<uint8_t>(r.space));
      w.U8(0);
      w.U16(0);
      w.U32(r.device);
      w.U64(r.base);
      w.U64(r.size);
      w.U32(r.map);
    }
  }
  uint64_t total = 0;  // exit records; the exits section is written by the caller
  auto count_of = [&](size_t i) -> uint64_t {
    return exit_counts != nullptr ? exit_counts[i] : d.vcpus[i].exits.size();
  };
  for (size_t i = 0; i < d.vcpus.size(); ++i) total += count_of(i);
  {
    Writer& v = sec[kVcpus];
    v.U32(static_cast<uint32_t>(d.vcpus.size()));
    for (size_t i = 0; i < d.vcpus.size(); ++i) {
      const DumpVcpu& c = d.vcpus[i];
      v.U32(c.vcpu);
      v.U64(c.counters.capacity);
      v.U64(c.counters.written);
      v.U64(c.counters.overwritten);
      v.U64(c.counters.skipped);
      v.U64(count_of(i));
      v.U8(c.in_progress ? 1 : 0);
      if (c.in_progress) PutExit(v, *c.in_progress, guest);
      v.U32(static_cast<uint32_t>(c.named_counters.size()));
      for (const auto& [name, value] : c.named_counters) {
        strings.Ref(v, name);
        v.U64(value);
      }
    }
  }
  {
    Writer& w = sec[kDeviceEvents];
    w.U32(static_cast<uint32_t>(d.device_events.size()));
    for (const DumpDeviceEvent& e : d.device_events) {
      w.U64(e.time_ns);
      w.U8(static_cast<uint8_t>(e.type));
      w.U8(e.note_truncated ? 1 : 0);
      w.U16(0);
      w.U32(e.device);
      w.U64(e.io_id);
      w.I64(e.status);
      strings.Ref(w, e.note);
    }
  }
  {
    Writer& w = sec[kFindings];
    w.U32(static_cast<uint32_t>(d.findings.size()));
    for (const FindingRecord& f : d.findings) {
      w.U64(f.time_ns);
      w.U8(static_cast<uint8_t>(f.type));
      w.U8(static_cast<uint8_t>(f.kind));
      w.U8(static_cast<uint8_t>(f.dir));
      w.U8(f.size);
      w.U32(f.vcpu);
      w.U64(f.duration_ns);
      w.U64(f.addr);
      w.U32(f.device);
      w.U32(f.reg);
      w.U32(f.reg_element);
      w.U32(f.reg_delta);
      w.U64(f.io_id);
      strings.Ref(w, f.text);
    }
  }
  {  // since version 4: thread ids, stack counters, the findings' stacks
    Writer& w = sec[kStacks];
    w.U32(static_cast<uint32_t>(d.vcpus.size()));
    for (const DumpVcpu& c : d.vcpus) w.U32(static_cast<uint32_t>(c.tid));
    const StackCounters& sc = d.stack_counters;
    for (uint64_t v :
         {sc.captures, sc.signal_timeouts, sc.exit_changed, sc.frames_dropped, sc.captures_skipped})
      w.U64(v);
    uint32_t n = 0;
    for (const FindingRecord& f : d.findings) n += HasStack(f.stack) ? 1 : 0;
    w.U32(n);
    for (size_t i = 0; i < d.findings.size(); ++i) {
      const ThreadStack& st = d.findings[i].stack;
      if (!HasStack(st)) continue;
      w.U32(static_cast<uint32_t>(i));
      w.U32(static_cast<uint32_t>(st.tid));
      w.U8(static_cast<uint8_t>(st.state));
      w.U8(0);
      w.U16(0);
      w.U32(st.capture);
      w.U32(st.user_dropped);
      strings.Ref(w, st.note);
      w.U32(static_cast<uint32_t>(st.user.size()));
      w.U32(static_cast<uint32_t>(st.kernel.size()));
      for (const std::vector<StackFrame>* frames : {&st.user, &st.kernel}) {
        for (const StackFrame& fr : *frames) {
          w.U64(fr.ip);
          w.U64(fr.offset);
          strings.Ref(w, fr.function);
          strings.Ref(w, fr.module);
          strings.Ref(w, fr.file);
          w.U32(fr.line);
        }
      }
    }
  }
  sec[kStrings].buf() = strings.data();

  // Layout: header, section table, the other sections in id order, then the exits (their
  // size, known once they are coded, is set by SetExitsSize).
  out->total_exits = total;
  uint64_t file_size = kHeaderSize + kSectionCount * kSectionEntrySize;
  for (uint32_t id = 1; id <= kSectionCount; ++id) {
    if (id == kExits) continue;
    out->bytes[id] = std::move(sec[id].buf());
    out->size[id] = out->bytes[id].size();
    out->offset[id] = file_size;
    file_size += out->size[id];
  }
  out->offset[kExits] = file_size;
  SetExitsSize(out, 0);
}

void SetExitsSize(DumpSections* s, uint64_t bytes) {
  s->size[kExits] = bytes;
  s->file_size = s->offset[kExits] + bytes;
}

std::string HeaderAndTable(const DumpSections& s, const uint32_t (&crc)[kSectionCount + 1]) {
  Writer table;
  for (uint32_t id = 1; id <= kSectionCount; ++id) {
    table.U32(id);
    table.U32(0);
    table.U64(s.offset[id]);
    table.U64(s.size[id]);
    table.U32(crc[id]);
    table.U32(0);
  }
  Writer h;
  h.buf().append(kDumpMagic, 8);
  h.U32(kDumpVersion);
  h.U32(kHeaderSize);
  h.U32(s.guest ? kFlagGuestData : 0);
  h.U32(kSectionCount);
  h.U64(s.file_size);
  h.U32(base::Crc32Of(table.buf()));
  h.U32(0);  // header crc, patched below
  h.buf().resize(kHeaderSize, '\0');
  PutLe(h.buf().data() + 36, base::Crc32Of(h.buf()), 4);
  return h.buf() + table.buf();
}

}  // namespace internal

namespace {

void SerializeInto(const Dump& d, const DumpOptions& opts, std::string* out, bool headroom) {
  DumpSections s;
  BuildSections(d, opts, nullptr, &s);
  // The exits section first (its size decides the file's), coded a block at a time into a
  // buffer that grows by doubling: 8-byte total, then each vCPU's records.
  std::string x;
  x.reserve(8 + s.total_exits * 8);
  x.resize(8);
  PutLe(x.data(), s.total_exits, 8);
  {
    ExitEncoder enc;
    constexpr size_t kBlock = 64 * 1024;
    char block[kBlock];
    size_t used = 0;
    for (const DumpVcpu& v : d.vcpus) {
      enc.NextVcpu();
      for (const DumpExit& e : v.exits) {
        if (used > kBlock - kMaxCodedExit) {
          x.append(block, used);
          used = 0;
        }
        // Coded from where it is (a fresh copy would stall the coder's wide loads on store
        // forwarding) unless it has a value to drop (not `as_is ? e : ForFile(..)`, which
        // would copy either way).
        const bool as_is = s.guest || (e.value == 0 && (e.flags & kExitFlagValue) == 0);
        char* const end =
            as_is ? enc.Put(e, block + used) : enc.Put(ForFile(e, false), block + used);
        used = static_cast<size_t>(end - block);
      }
    }
    x.append(block, used);
  }
  SetExitsSize(&s, x.size());
  const uint64_t file_size = s.file_size;
  uint32_t crc[kSectionCount + 1] = {};
  // One allocation of the file's size, written once.
  // Growing: nothing to keep (and libstdc++ 12 would copy the old bytes). The operation is
  // told the new size, but libstdc++ 12 may pass a larger one (its growth policy leaks into n),
  // so it returns file_size, not n.
  if (out->capacity() < file_size) {
    out->clear();
    if (headroom) out->reserve(file_size + file_size / 8);
  }
  out->resize_and_overwrite(file_size, [&](char* p, size_t) {
    for (uint32_t id = 1; id <= kSectionCount; ++id) {
      const std::string& b = id == kExits ? x : s.bytes[id];
      if (!b.empty()) std::memcpy(p + s.offset[id], b.data(), b.size());
      crc[id] = base::Crc32Of(b);
    }
    const std::string head = HeaderAndTable(s, crc);
    std::memcpy(p, head.data(), head.size());
    return static_cast<size_t>(file_size);
  });
}

}  // namespace

// ---- Dump files --------------------------------------------------------------------------

namespace internal {
namespace {
std::atomic<DumpWriteHook> dump_write_hook{nullptr};
}  // namespace

void SetDumpWriteHookForTests(DumpWriteHook hook) noexcept {
  dump_write_hook.store(hook, std::memory_order_relaxed);
}

base::OutputOptions DumpFileOptions() noexcept {
  return {.what = "a dump",
          .follow_symlink = false,
          .allow_stdout = false,
          .mode = 0640,
          .after_write = dump_write_hook.load(std::memory_order_relaxed)};
}

ExitStream::ExitStream(DumpFile* file, uint64_t section_offset)
    : file_(file),
      section_offset_(section_offset),
      block_(new char[kBlockBytes]),
      spare_(new char[kBlockBytes]) {
  try {
    writer_ = std::thread(&ExitStream::WriterLoop, this);
  } catch (const std::system_error&) {
    // No thread: Flush writes inline.
  }
}

ExitStream::~ExitStream() {
  StopWriter();
}

void ExitStream::WriterLoop() noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return pending_ != nullptr || stop_; });
    if (pending_ == nullptr) return;  // stopped, nothing left
    const char* p = pending_;
    const size_t n = pending_bytes_;
    const uint64_t off = pending_offset_;
    const bool ok = static_cast<bool>(status_);
    lock.unlock();
    Status s = ok ? file_->WriteAt(p, n, off) : Status{};
    lock.lock();
    if (!s) status_ = std::move(s);
    pending_ = nullptr;
    cv_.notify_all();
  }
}

void ExitStream::StopWriter() noexcept {
  if (!writer_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

void ExitStream::Flush() noexcept {
  const size_t bytes = in_block_;
  const uint64_t offset = section_offset_ + 8 + flushed_;
  flushed_ += bytes;
  in_block_ = 0;
  if (bytes == 0) return;
  crc_ = base::Crc32Extend(crc_, block_.get(), bytes);
  if (!writer_.joinable()) {
    if (status_) status_ = file_->WriteAt(block_.get(), bytes, offset);
    return;
  }
  {
    // Wait until the writer is done with the spare block, then hand it this one.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == nullptr; });
    pending_ = block_.get();
    pending_bytes_ = bytes;
    pending_offset_ = offset;
  }
  cv_.notify_all();
  std::swap(block_, spare_);
}

Status ExitStream::Finish(uint32_t* crc, uint64_t* bytes) {
  Flush();
  StopWriter();  // after the last block's pwrite
  if (!status_) return status_;
  char count[8];
  PutLe(count, records_, 8);
  *crc = base::Crc32Combine(base::Crc32Extend(0, count, 8), crc_, flushed_);
  *bytes = 8 + flushed_;
  return file_->WriteAt(count, 8, section_offset_);
}

Status WriteSections(const Dump& d, const DumpOptions& opts, DumpFile* f) {
  DumpSections s;
  BuildSections(d, opts, nullptr, &s);
  uint32_t crc[kSectionCount + 1] = {};
  ExitStream exits(f, s.offset[kExits]);
  for (const DumpVcpu& v : d.vcpus) {
    exits.NextVcpu();
    for (const DumpExit& e : v.exits) {
      if (s.guest || (e.value == 0 && (e.flags & kExitFlagValue) == 0)) {
        exits.Add(e);
      } else {
        exits.Add(ForFile(e, false));
      }
    }
  }
  uint64_t bytes = 0;
  EXITSCOPE_RETURN_IF_ERROR(exits.Finish(&crc[kExits], &bytes));
  SetExitsSize(&s, bytes);
  for (uint32_t id = 1; id <= kSectionCount; ++id) {
    if (id == kExits) continue;
    crc[id] = base::Crc32Of(s.bytes[id]);
    EXITSCOPE_RETURN_IF_ERROR(f->WriteAt(s.bytes[id].data(), s.bytes[id].size(), s.offset[id]));
  }
  const std::string head = HeaderAndTable(s, crc);
  return f->WriteAt(head.data(), head.size(), 0);
}

}  // namespace internal

Status WriteDumpFile(const Dump& dump, const std::string& path, const DumpOptions& opts) {
  DumpFile f;
  EXITSCOPE_RETURN_IF_ERROR(f.Open(path, DumpFileOptions()));
  EXITSCOPE_RETURN_IF_ERROR(WriteSections(dump, opts, &f));
  return f.Commit();
}

}  // namespace exitscope
