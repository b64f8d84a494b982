// sources/tracefs_session.h: a live kernel tracing session on tracefs, that leaves tracefs as
// it found it.
//
// A TracefsSession finds tracefs (mounting it when it is missing and we may), picks a trace
// buffer, enables the events asked for, chooses the trace clock (x86-tsc where the kernel
// offers it, so kernel timestamps line up with rdtsc in the VMM; else mono), optionally
// restricts events to a process and its threads and children, and starts tracing.
//
// Which buffer:
//   - by default a private instance `instances/exitscope-<pid>` that the session creates and
//     removes: nothing anyone else set up at the top level (a running trace-cmd, perf, other
//     instances) is touched or even expanded;
//   - `instance = "NAME"` uses an existing instance, `top_level = true` the top-level buffer.
//     Then every file the session writes is snapshotted first (TracefsSettings) and written
//     back when the session ends, byte for byte.
//
// Ending: Close() (or the destructor, or an error path inside Open) restores. Signals do not
// restore from inside the handler (tracefs writes are not async-signal-safe): a
// StopSignalScope installs SIGINT/SIGTERM/SIGHUP handlers that only set a flag; the main
// loop polls StopRequested() and then lets the session close normally. A session killed with
// SIGKILL leaves its private instance behind; the next Open() removes instances of dead
// exitscope processes.
//
// Example:
//   exitscope::sources::TracefsOptions opt;
//   opt.events = {"kvm:*"};
//   opt.pid = vmm_pid;
//   auto s = exitscope::sources::TracefsSession::Open(opt);
//   if (!s) { puts(s.error().message.c_str()); return 1; }
//   (*s)->Start();  ... read (*s)->instance_dir() + "/per_cpu/cpuN/trace_pipe_raw" ...
//   (*s)->Close();
#pragma once

#include <sys/types.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exitscope/status.h"

namespace exitscope::sources {

// Locates tracefs. `dir` empty: $EXITSCOPE_TRACEFS if set, else /sys/kernel/tracing (mounting
// it when `mount_if_missing` and it is not mounted), else /sys/kernel/debug/tracing.
// Errors are one line saying what to do: kUnavailable when missing, kPermission when not
// permitted.
Result<std::string> FindTracefs(const std::string& dir = "", bool mount_if_missing = true);

// A buffer_size_kb file as the kernel prints it (tracing_entries_read in kernel/trace/trace.c):
//   "1410"               KiB allocated per CPU (whole pages of data, so writing 1408 reads 1410);
//   "X"                  the total file when the per-CPU sizes differ;
//   "7 (expanded: 1408)" the total file of a buffer that was never used: 7 KiB (the two-page
//                        minimum) allocated per CPU, 1408 KiB (trace_buf_size) as soon as any
//                        event is enabled or any size is written. The per-CPU files of such a
//                        buffer read the placeholder ("7"), not the size it will have.
// Only the top-level buffer is ever unexpanded: instances are created at full size.
struct BufferSizeKb {
  bool mixed = false;                   // "X"
  uint64_t kb = 0;                      // allocated per CPU now
  std::optional<uint64_t> expanded_kb;  // set while the buffer is not yet expanded
};
// kCorrupt naming the content when it is none of the three forms.
Result<BufferSizeKb> ParseBufferSizeKb(std::string_view content);

// Whether a buffer whose size file read `saved` traces as one that reads `now`: the same
// content, or `saved` unexpanded and `now` the size the kernel gives it when it expands
// (`page_data_bytes` per page: 1408 KiB in pages of 4080 bytes reads 1410).
bool SameBufferSize(std::string_view saved, std::string_view now, uint64_t page_data_bytes);

// Byte-for-byte snapshot of the tracefs files a session may write in one buffer (the
// top-level tracing dir or an instance dir): tracing_on, trace_clock, buffer_size_kb (total
// and per CPU), set_event_pid, options/event-fork, and enable + filter of every event in the
// given systems. Derived files (set_event, events/<sys>/enable) are captured for comparison
// but never written.
//
// Restore writes back what each file read, except where the read-back form is not a value the
// file accepts: a filter "none" is cleared with "0", trace_clock "[local] global ..." is
// written "local", a pid list one per line is written space separated, an enable "1*" (soft
// mode) is written "1", and an unexpanded buffer ("7 (expanded: 1408)") is restored to its
// expanded size, 1408, on every CPU: it is never shrunk to the 7 KiB placeholder. Enabling
// any event expands it, and the kernel has no way back to "unexpanded"; the expanded size is
// the one the host would trace with the next time anyone traces, so it traces as before.
class TracefsSettings {
 public:
  // Reads the files under `buffer_dir`. Files that do not exist on this kernel are skipped.
  static Result<TracefsSettings> Capture(const std::string& buffer_dir,
                                         const std::vector<std::string>& systems);

  // Writes back every captured file whose current content differs, in an order that keeps
  // the buffer quiet (events off first, tracing_on last). Continues past failures and
  // reports the first one.
  Status Restore() const;

  // Files whose content differs between two snapshots, as "path: 'old' -> 'new'" lines.
  // Buffer sizes compare with SameBufferSize: an unexpanded buffer (and its per-CPU
  // placeholder sizes) equals the same buffer expanded to the size it promised.
  std::vector<std::string> Diff(const TracefsSettings& other) const;

  // Bytes of trace data per ring-buffer page (events/header_page, else page size - 16).
  uint64_t page_data_bytes() const { return page_data_bytes_; }

  const std::vector<std::pair<std::string, std::string>>& files() const { return files_; }
  const std::string& buffer_dir() const { return dir_; }

 private:
  // The saved content of `rel`, or nullptr.
  const std::string* Find(const std::string& rel) const;

  std::string dir_;
  std::vector<std::pair<std::string, std::string>> files_;  // relative path, content
  uint64_t page_data_bytes_ = 4080;
};

struct TracefsOptions {
  std::string tracefs_dir;  // empty: FindTracefs()
  bool mount_if_missing = true;
  std::string instance;    // existing instance to use; empty: private instance
  bool top_level = false;  // use the top-level buffer (settings saved, restored)
  // Events as "system:event", "system:*" or "system" (whole system). Unknown events fail
  // Open with kInvalidArgument.
  std::vector<std::string> events = {"kvm:*"};
  // Trace clocks in order of preference; the first one the kernel offers is used. Empty:
  // keep the buffer's current clock.
  std::vector<std::string> clocks = {"x86-tsc", "mono"};
  pid_t pid = 0;                // >0: only this process, its threads and children
  bool follow_children = true;  // options/event-fork with the pid filter
  size_t buffer_kb = 0;         // per-CPU buffer size in KiB; 0: keep the default
};

class TracefsSession {
 public:
  // Finds tracefs, snapshots, applies the options (tracing stays off until Start). On any
  // failure what was changed so far is restored and the error returned.
  static Result<std::unique_ptr<TracefsSession>> Open(const TracefsOptions& options);

  ~TracefsSession();
  TracefsSession(const TracefsSession&) = delete;
  TracefsSession& operator=(const TracefsSession&) = delete;

  Status Start();  // tracing_on = 1
  Status Stop();   // tracing_on = 0 (the buffer keeps its content for a final read)

  // Restores every setting (or removes the private instance). Idempotent; the destructor
  // calls it. Readers of the per-CPU pipes must be closed first.
  Status Close();

  const std::string& tracefs_dir() const { return tracefs_dir_; }
  // The buffer's directory: tracefs_dir, or tracefs_dir/instances/NAME.
  const std::string& buffer_dir() const { return buffer_dir_; }
  const std::string& clock() const { return clock_; }  // the trace clock in use
  int cpu_count() const { return cpus_; }
  size_t subbuf_size() const { return subbuf_size_; }  // bytes per raw page
  // The systems whose events are enabled ("kvm", ...), for writing their formats.
  const std::vector<std::string>& systems() const { return systems_; }
  // "system:event" names actually enabled.
  const std::vector<std::string>& enabled_events() const { return enabled_; }
  bool owns_instance() const { return owns_instance_; }

  // Adds pid's threads (from /proc/pid/task) to the pid filter.
  Status AddPid(pid_t pid);

 private:
  TracefsSession() = default;
  Status Apply(const TracefsOptions& options);

  std::string tracefs_dir_;
  std::string buffer_dir_;
  std::string clock_;
  int cpus_ = 0;
  size_t subbuf_size_ = 4096;
  std::vector<std::string> systems_;
  std::vector<std::string> enabled_;
  bool owns_instance_ = false;
  bool closed_ = false;
  std::unique_ptr<TracefsSettings> saved_;
};

// Installs SIGINT, SIGTERM and SIGHUP handlers that record the signal and return (no
// SA_RESTART, so a sleeping main loop wakes up); the previous handlers come back when the
// scope ends. Not nestable across threads; meant for a CLI main loop.
class StopSignalScope {
 public:
  StopSignalScope();
  ~StopSignalScope();
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;

  static bool StopRequested() noexcept;
  static int LastSignal() noexcept;  // 0 when none
  static void Reset() noexcept;

 private:
  struct sigaction old_[3];
};

// Helpers shared by the tracefs sources (plain file I/O with errno in the message).
Result<std::string> ReadTracefsFile(const std::string& path);
Status WriteTracefsFile(const std::string& path, const std::string& value);

}  // namespace exitscope::sources
