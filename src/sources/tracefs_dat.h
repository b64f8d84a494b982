// sources/tracefs_dat.h: writing raw trace pages into a trace-cmd .dat file (version 6).
//
// `exitscope kvm record` stores what it reads from trace_pipe_raw in the file format trace-cmd
// itself writes, so `trace-cmd report FILE` and exitscope's own .dat reader
// (libtracecmd) all read it. libtracecmd 1.3 exports no writer in its public header, so the
// format is written here, following trace-cmd.dat.v6(5):
//
//   "\x17\x08\x44tracing" "6\0" endian(1) long-size(1) page-size(u32)
//   "header_page\0" u64 len, text        "header_event\0" u64 len, text
//   u32 n, n x (u64 len, events/ftrace/*/format)
//   u32 systems, per system: name\0, u32 n, n x (u64 len, format)
//   u32 len kallsyms (empty)   u32 len printk_formats   u64 len saved_cmdlines
//   u32 cpus
//   "options  \0"  { u16 id, u32 len, data }* u16 0     (TRACECLOCK, CPUSTAT per CPU, UNAME)
//   "flyrecord\0"  cpus x (u64 offset, u64 size)  u64 len, trace_clock text
//   zero padding to a page boundary, then each CPU's pages back to back
//
// Pages are stored exactly as the kernel produced them, lost-event flags included, so the
// reader sees every loss the kernel reported. Until Finish() the pages go to unlinked temp
// files beside the output; Finish() writes the header (with saved_cmdlines and per-CPU stats
// taken at the end of the recording) and the data. A writer destroyed without Finish()
// removes the partial output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/output_file.h"
#include "exitscope/status.h"

namespace exitscope::sources {

class TracefsSession;

class TraceDatWriter {
 public:
  struct Layout {
    std::string tracefs_dir;  // formats, header_page, printk_formats come from here
    // The traced buffer: its per-CPU stats are taken at Create as a baseline, so the CPUSTAT
    // counters in the file (overrun, read events, ...) cover this recording only. Empty: no
    // baseline (a fresh buffer).
    std::string buffer_dir;
    std::vector<std::string> systems;  // event systems whose formats are stored
    int cpus = 0;
    size_t page_size = 4096;
  };

  // Creates (truncates) `path` and reads the event formats now.
  static Result<std::unique_ptr<TraceDatWriter>> Create(const std::string& path,
                                                        const Layout& layout);
  static Result<std::unique_ptr<TraceDatWriter>> Create(const std::string& path,
                                                        const TracefsSession& session);
  ~TraceDatWriter();

  // Appends one raw page (exactly page_size bytes) of `cpu`.
  Status AddPage(int cpu, const uint8_t* page, size_t size);

  // Writes the file. `buffer_dir` is the traced buffer (for trace_clock and per-CPU stats);
  // saved_cmdlines come from the tracefs top level.
  Status Finish(const std::string& buffer_dir);

  uint64_t pages() const;
  uint64_t bytes_written() const { return bytes_written_; }
  const std::string& path() const { return path_; }

 private:
  TraceDatWriter() = default;
  std::string path_;
  Layout layout_;
  base::OutputFile out_;  // the .dat, renamed into place by Finish
  std::vector<int> cpu_fds_;
  std::vector<uint64_t> cpu_pages_;
  std::string header_;                       // everything up to the cmdlines, built at Create
  std::vector<std::string> baseline_stats_;  // per CPU, per_cpu/cpuN/stats at Create
  bool finished_ = false;
  uint64_t bytes_written_ = 0;
};

}  // namespace exitscope::sources
