// recorder/dump_file.h: the pieces of the dump writer (dump_writer.cc) that a dump written
// straight to a file needs (Recorder::WriteDump in dump_stream.cc, WriteDumpFile): every
// section but `exits` serialised from a Dump, the file's layout, the header and section table,
// the exits section encoded and checksummed a block at a time on its way to the file, and the
// temporary file that replaces the dump atomically. Not public API; the format is
// docs/dump-format.md (the bytes are those of SerializeDump).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

#include "base/output_file.h"
#include "exitscope/dump.h"
#include "exitscope/status.h"
#include "recorder/dump_format.h"
#include "recorder/exit_codec.h"

namespace exitscope::internal {

// Every section but kExits, serialised (bytes[kExits] stays empty), with the exits count and
// the file's layout: header, section table, the other sections back to back in id order, then
// the exits (offset[kExits] is set; its size is not known until the records are coded).
struct DumpSections {
  std::string bytes[kSectionCount + 1];
  uint64_t total_exits = 0;
  bool guest = false;  // exit values written (opts.include_guest_data && dump's flag)
  uint64_t offset[kSectionCount + 1] = {};
  uint64_t size[kSectionCount + 1] = {};
  uint64_t file_size = 0;
};

// Fills *out from `d`. `exit_counts` (one per d.vcpus entry) gives each vCPU's exit count
// when the exits are not in `d` (a streamed dump); nullptr: d.vcpus[i].exits.size(). Sizes
// depend only on what is not a fixed-width number: two calls that differ only in counters and
// counts give the same layout.
void BuildSections(const Dump& d, const DumpOptions& opts, const uint64_t* exit_counts,
                   DumpSections* out);

// The header and section table (kHeaderSize + kSectionCount * kSectionEntrySize bytes) for
// `s` with per-section CRCs `crc` (crc[kExits] included).
std::string HeaderAndTable(const DumpSections& s, const uint32_t (&crc)[kSectionCount + 1]);

// Sets the exits section's size (8-byte total + coded records) and with it the file's: the
// exits are the last section of the file.
void SetExitsSize(DumpSections* s, uint64_t bytes);

// `e` as the file stores it: without its value when the dump holds no guest data.
inline DumpExit ForFile(const DumpExit& e, bool guest_data) noexcept {
  DumpExit f = e;
  if (!guest_data) {
    f.value = 0;
    f.flags = static_cast<uint8_t>(f.flags & ~kExitFlagValue);
  }
  return f;
}

// A dump file being written: base::OutputFile's rule (a new temporary file beside `path`
// renamed over it by Commit after fsync; only a regular file is replaced; destroyed uncommitted,
// the temporary file is removed and `path` is untouched). Open it with DumpFileOptions().
using DumpFile = base::OutputFile;
base::OutputOptions DumpFileOptions() noexcept;  // with the test hook below, when set

// Test-only: `hook` (nullptr: none, the default) is called after every write into a dump
// file's temporary file with the bytes written into it so far, before the file is committed.
// The fault matrix stops a child at a chosen point of a dump this way (docs/faults.md).
using DumpWriteHook = void (*)(uint64_t written);
void SetDumpWriteHookForTests(DumpWriteHook hook) noexcept;

// The exits section on its way to a DumpFile: Add codes each record (exit_codec.h) into a
// block that stays in cache, and each full block is checksummed there and handed to a writer
// thread that pwrites it at the next offset while the next block is filled (two blocks: the
// copy into the page cache runs beside the ring reading; no copy of the dump in memory, no
// fresh pages but the page cache's). Without a thread (std::thread failed), blocks are
// written inline. The first 8 bytes of the section (the count) are known last: Finish writes
// them and combines the CRCs.
class ExitStream {
 public:
  static constexpr size_t kBlockBytes = 128 * 1024;  // in L2 while checksummed

  ExitStream(DumpFile* file, uint64_t section_offset);
  ~ExitStream();  // waits for the writer thread
  ExitStream(const ExitStream&) = delete;
  ExitStream& operator=(const ExitStream&) = delete;

  // Before the first record of each vCPU: its start delta and access history begin afresh.
  void NextVcpu() noexcept { enc_.NextVcpu(); }
  // `e` as the file stores it (ForFile: without its value when the dump holds no guest data).
  // Best from memory written a while before (an array, not a DumpExit just filled in): the
  // coder's wide loads of a record just stored field by field stall on store forwarding.
  void Add(const DumpExit& e) noexcept {
    if (in_block_ > kBlockBytes - kMaxCodedExit) Flush();
    in_block_ = static_cast<size_t>(enc_.Put(e, block_.get() + in_block_) - block_.get());
    ++records_;
  }
  // Writes what is left and the count; the section's CRC goes to *crc and its size (count
  // included) to *bytes. The first write error, if any, is returned here (records after it
  // are dropped).
  Status Finish(uint32_t* crc, uint64_t* bytes);
  uint64_t records() const noexcept { return records_; }

 private:
  void Flush() noexcept;
  void WriterLoop() noexcept;
  void StopWriter() noexcept;
  DumpFile* file_;
  uint64_t section_offset_;
  ExitEncoder enc_;
  std::unique_ptr<char[]> block_, spare_;
  size_t in_block_ = 0;   // bytes
  uint64_t records_ = 0;  // added
  uint64_t flushed_ = 0;  // bytes flushed
  uint32_t crc_ = 0;      // of the flushed bytes

  std::mutex mu_;  // the hand-off to the writer thread
  std::condition_variable cv_;
  const char* pending_ = nullptr;  // a block waiting for (or in) its pwrite
  size_t pending_bytes_ = 0;
  uint64_t pending_offset_ = 0;
  bool stop_ = false;
  Status status_;  // of the first failed write, else success (under mu_ with a writer)
  std::thread writer_;
};

// The file SerializeDump makes, written to `f` as it is encoded (the exits a block at a time;
// no string of the whole file). Does not commit.
Status WriteSections(const Dump& d, const DumpOptions& opts, DumpFile* f);

}  // namespace exitscope::internal
