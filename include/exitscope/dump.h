// exitscope/dump.h: a snapshot of everything the recorder knows, in memory (Dump) and as a
// self-describing, versioned binary file (docs/dump-format.md).
//
// Recorder::Snapshot() and ReadDump() return the same Dump, so one report serves both live
// recorders and files. Times in a Dump are CLOCK_MONOTONIC nanoseconds of the recording host
// (converted with the stored clock calibration); `realtime_ns`/`monotonic_ns` of the snapshot
// let a reader map them to wall-clock time.
//
// Guest data (ExitRecord::value: the bytes a guest wrote or read) is written to a file only
// with DumpOptions::include_guest_data = true; otherwise values are zeroed, the value flag is
// cleared and Dump::includes_guest_data is false.
//
// ReadDump validates everything (magic, version, section table, per-section CRC32, lengths,
// section overlap, indices) and returns kCorrupt / kUnsupported / kIo with a one-line message
// such as "x.esdump: truncated at offset 4096: section 'exits' needs 57344 bytes" or
// "x.esdump: dump version 3 is newer than this exitscope (max 1)". It never crashes and has no
// undefined behaviour on any input. What is wrong inside one record (an unknown exit kind or
// direction, a device index out of range, guest data in a dump without it) never makes the
// whole dump unreadable: the record is kept as far as it is meaningful, and Dump::warnings
// says what was found and how often. So do implausible values (a NaN clock, counters that
// cannot be true, strings that are not UTF-8).
//
// ReadDump opens only regular files, checks the size with fstat before reading, and reads at
// most kMaxDumpFileBytes; memory use is about 3x the file's size.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exitscope/address_space.h"
#include "exitscope/clock.h"
#include "exitscope/device_events.h"
#include "exitscope/exit_record.h"
#include "exitscope/export.h"
#include "exitscope/flight_recorder.h"
#include "exitscope/register_map.h"
#include "exitscope/status.h"
#include "exitscope/watchdog.h"

namespace exitscope {

// The newest version this code writes; it reads every version from 1 up to it. Version 2 added
// DumpExit::map to each exit record; version 3 codes each exit against its vCPU's recent ones
// (the start against the previous, the access from the last 8), a few bytes instead of 60
// (docs/dump-format.md); version 4 adds the `stacks` section: each vCPU's thread id, the stack
// capture counters and the ThreadStack of each finding that has one.
inline constexpr uint32_t kDumpVersion = 4;
inline constexpr uint64_t kMaxDumpFileBytes = 4ull << 30;  // ReadDump refuses larger files
inline constexpr char kDumpMagic[8] = {'E', 'X', 'S', 'C', 'D', 'U', 'M', 'P'};

struct DumpOptions {
  bool include_guest_data = false;  // write ExitRecord::value (guest bytes) into the file
  uint64_t max_exits_per_vcpu = 0;  // 0 = everything the rings hold; else the newest N
  // Threads Recorder::WriteDump codes the rings on, each taking whole vCPUs (the calling
  // thread is one of them). 0: one per 65536 records the rings hold, at most one per online
  // CPU and 8. The file is the same whatever the number.
  uint32_t threads = 0;
};

// One exit, times in ns.
struct DumpExit {
  uint64_t start_ns = 0;
  uint64_t duration_ns = 0;
  uint64_t addr = 0;
  uint64_t value = 0;  // 0 unless flags & kExitFlagValue
  uint32_t vcpu = 0;
  uint32_t device = kUnassigned;  // index into Dump::devices
  uint32_t reg = kNoRegister;     // index into the register map `map`
  uint32_t reg_element = 0;
  uint32_t reg_delta = 0;
  ExitKind kind = ExitKind::kUnknown;
  uint8_t size = 0;
  AccessDir dir = AccessDir::kNone;
  uint8_t flags = 0;  // ExitFlags
  // Index into Dump::maps of the register map this exit was resolved in: that of its range in
  // the address-space generation the exit used, so a range moved or removed later (a guest
  // reprogramming a PCI BAR) still names the exits taken before. kNoRegister when the range
  // has no map, the exit is not MMIO/PIO, or the dump is version 1 (then RegisterName falls
  // back to the ranges at snapshot time).
  uint32_t map = kNoRegister;
};

struct DumpVcpu {
  uint32_t vcpu = 0;
  int32_t tid = 0;  // the vCPU's thread id (Recorder::SetThreadId or its first exit); 0 unknown
  RingCounters counters;
  std::vector<DumpExit> exits;                     // oldest first
  std::optional<DumpExit> in_progress;             // the exit the vCPU was inside at snapshot time;
                                                   // duration_ns = time spent so far
  std::map<std::string, uint64_t> named_counters;  // SetVcpuCounter ("kvm.exits", ...)
};

struct DumpDeviceEvent {
  uint64_t time_ns = 0;
  DeviceEventType type = DeviceEventType::kNote;
  uint32_t device = kUnassigned;
  uint64_t io_id = 0;
  int64_t status = 0;
  std::string note;
  bool note_truncated = false;
};

struct DumpRange {
  IoSpace space = IoSpace::kMmio;
  uint64_t base = 0;
  uint64_t size = 0;
  uint32_t device = kUnassigned;
  uint32_t map = kNoRegister;  // index into Dump::maps, kNoRegister when none
};

struct ProcessInfo {
  int64_t pid = 0;
  std::string comm;                // /proc/self/comm
  std::vector<std::string> argv;   // /proc/self/cmdline
  uint64_t start_realtime_ns = 0;  // process start, wall clock (from /proc/self/stat + btime)
};

struct HostInfo {
  std::string sysname, nodename, release, version, machine;  // uname(2)
  std::string cpu_model;                                     // /proc/cpuinfo "model name"
  uint32_t cpus = 0;
};

// Counters of the recorder as a whole.
struct RecorderCounters {
  uint64_t bad_vcpu = 0;  // BeginExit/EndExit with vcpu >= num_vcpus (dropped)
  uint64_t end_without_begin = 0;
  uint64_t begin_without_end = 0;
  uint64_t slow_exits = 0;
  uint64_t findings_dropped = 0;  // findings pushed out of the findings ring
  uint64_t io_inflight_overflow = 0;
  uint64_t io_untracked_completions = 0;
  uint64_t io_in_flight = 0;
};

struct EXITSCOPE_EXPORT Dump {
  uint32_t version = kDumpVersion;
  bool includes_guest_data = false;
  uint64_t monotonic_ns = 0;  // when the snapshot was taken
  uint64_t realtime_ns = 0;   // same instant, wall clock (ns since the epoch)
  ClockCalibration clock;
  uint64_t slow_exit_threshold_ns = 0;
  WatchdogOptions watchdog;
  bool watchdog_running = false;
  ProcessInfo process;
  HostInfo host;
  std::vector<std::pair<std::string, std::string>> attributes;  // SetAttribute, sorted by key
  std::vector<DeviceInfo> devices;
  std::vector<DumpRange> ranges;
  std::vector<RegisterMap> maps;
  std::vector<DumpVcpu> vcpus;
  std::vector<DumpDeviceEvent> device_events;  // oldest first
  DeviceEventCounters device_event_counters;
  std::vector<FindingRecord> findings;  // oldest first
  RecorderCounters counters;
  StackCounters stack_counters;  // version 4 on (0 in older dumps)
  // What ReadDump/ParseDump found wrong but could read past, one line each, e.g.
  // "2 exit records have an unknown kind (first: 99); shown as kind#99". Never written to a
  // file; empty for a snapshot and for a clean dump.
  std::vector<std::string> warnings;

  // Name of device `index`: "nvme0"; "" for kUnassigned; "#7" if out of range.
  std::string DeviceName(uint32_t index) const;
  // Register name of an exit ("SQ1TDBL", "CC+2"), "" when none: from the map the exit was
  // resolved in (DumpExit::map), so it survives a range moved after the exit; for a version-1
  // dump, from the range holding the address at snapshot time.
  std::string RegisterName(const DumpExit& e) const;
  // Register name from the range holding `addr` at snapshot time (findings, version-1 exits).
  std::string RegisterName(uint32_t device, uint64_t addr, IoSpace space, uint32_t reg,
                           uint32_t element, uint32_t delta, uint32_t size) const;
  // The map of the range holding `addr` in `space` at snapshot time, or nullptr.
  const RegisterMap* MapFor(IoSpace space, uint64_t addr) const;
  // The map an exit was resolved in (DumpExit::map), else MapFor(its space, its address);
  // nullptr when none.
  const RegisterMap* MapFor(const DumpExit& e) const;
  // Value of an attribute, "" when absent.
  std::string Attribute(std::string_view key) const;
  // The one-line description used in logs: "exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008)".
  std::string DescribeExit(const DumpExit& e) const;
};

// Serialises a Dump into the file format; `opts.include_guest_data` false drops values.
EXITSCOPE_EXPORT std::string SerializeDump(const Dump& dump, const DumpOptions& opts = {});
// The same into `*out` (replacing its contents, reusing its capacity when large enough).
EXITSCOPE_EXPORT void SerializeDump(const Dump& dump, const DumpOptions& opts, std::string* out);
// Parses and validates bytes; `origin` names the input in messages.
EXITSCOPE_EXPORT Result<Dump> ParseDump(std::string_view bytes, std::string_view origin = "dump");
// Writes `dump` to `path` atomically: a new temporary file in the same directory (O_EXCL,
// never through a symlink), fsync, rename over `path`. Refuses (kInvalidArgument) when `path`
// exists and is not a regular file (a device node, FIFO, directory or symlink): a dump never
// replaces anything else. kIo with errno on failure; the previous file is then untouched.
EXITSCOPE_EXPORT Status WriteDumpFile(const Dump& dump, const std::string& path,
                                      const DumpOptions& opts = {});
// Reads and validates a dump file.
EXITSCOPE_EXPORT Result<Dump> ReadDump(const std::string& path);

// Which space an exit kind resolves in (kPio for kPio, kMmio otherwise).
inline IoSpace SpaceOf(ExitKind k) noexcept {
  return k == ExitKind::kPio ? IoSpace::kPio : IoSpace::kMmio;
}

}  // namespace exitscope
