// `exitscope kvm record`: records KVM tracepoints from tracefs into a trace-cmd .dat file
// that `exitscope kvm report -i FILE` (and `trace-cmd report FILE`) read.
//
//   exitscope kvm record -o FILE [--duration S] [-p PID] [-e EVENT]... [-- CMD ARGS...]
//
// With CMD it starts CMD as a child, traces only it (its threads and children) from its
// first instruction and stops when it exits; else it records the whole machine (or -p PID)
// for S seconds or until Ctrl-C. Every tracefs setting is restored at the end, after Ctrl-C
// and SIGTERM too.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/commands.h"
#include "cli/gated_child.h"
#include "cli/parse_args.h"
#include "fmt/format.h"
#include "sources/tracefs_dat.h"
#include "sources/tracefs_reader.h"
#include "sources/tracefs_session.h"

extern "C" {
#include <event-parse.h>
}

namespace exitscope::cli {
namespace {

using sources::RawPageDecoder;
using sources::StopSignalScope;
using sources::TepEvents;
using sources::TraceDatWriter;
using sources::TracefsOptions;
using sources::TracefsPageReader;
using sources::TracefsSession;

// Counts records per event id, for the summary line.
class CountingSink : public sources::RecordSink {
 public:
  void OnRecord(tep_handle* tep, tep_record* rec) override { ++by_type[tep_data_type(tep, rec)]; }
  std::map<int, uint64_t> by_type;
};

}  // namespace

int KvmRecordMain(int argc, char** argv) {
  const char* self = argc > 0 ? argv[0] : "exitscope kvm record";
  // Everything after "--" is the command to run.
  std::vector<std::string> cmd;
  int own_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      own_argc = i;
      for (int j = i + 1; j < argc; ++j) cmd.emplace_back(argv[j]);
      break;
    }
  }

  CLI::App app{
      "Record KVM tracepoints from tracefs into a trace-cmd .dat file that "
      "`exitscope kvm report -i FILE` and `trace-cmd report FILE` read.\n"
      "usage: exitscope kvm record -o FILE [options] [-- CMD ARGS...]",
      self};
  std::string output;
  double duration = 0;
  int pid = 0;
  std::vector<std::string> events;
  size_t buffer_kb = 0;
  int poll_ms = 10;
  std::string clock;
  std::string tracefs_dir;
  std::string instance;
  bool top_level = false;
  app.add_option("-o,--output", output, "the .dat file to write")->required();
  app.add_option("--duration", duration,
                 "stop after this many seconds (default: Ctrl-C, or "
                 "when CMD exits; 0..31536000)")
      ->check(NumberIn(0, 31'536'000, "s"));
  app.add_option("-p,--pid", pid,
                 "trace only this process (all its threads, and children "
                 "it forks)")
      ->check(IntegerIn(1, 4'194'304, ""));
  app.add_option("-e,--trace-event", events,
                 "events to record, SYSTEM:EVENT or SYSTEM:* "
                 "(repeatable; default kvm:*)");
  app.add_option("--buffer-kb", buffer_kb, "per-CPU ring buffer size in KiB (1..4194304)")
      ->check(IntegerIn(1, 4'194'304, "KiB"));
  app.add_option("--poll-ms", poll_ms, "how often the per-CPU buffers are drained")
      ->check(IntegerIn(1, 10'000, "ms"));
  app.add_option("--clock", clock, "trace clock (default: x86-tsc if offered, else mono)");
  app.add_option("--tracefs", tracefs_dir,
                 "tracefs mount point (default: $EXITSCOPE_TRACEFS "
                 "or /sys/kernel/tracing)");
  app.add_option("--instance", instance,
                 "record into this existing tracefs instance "
                 "(default: a private one, removed at the end)");
  app.add_flag("--top-level", top_level,
               "record into the top-level buffer (settings are "
               "restored at the end)");
  bool stacks = false;
  app.add_flag("--stacks", stacks,
               "not possible yet: a .dat file has no place for off-CPU stacks (say so and stop; "
               "kvm stat --bpf --stacks and kvm live --stacks show them, docs/kvm-stacks.md)");
  if (auto rc = ParseArgs(app, own_argc, argv)) return *rc;
  if (pid > 0 && !cmd.empty()) {
    std::fprintf(stderr, "%s: -p and a command after -- exclude each other\n", self);
    return 2;
  }
  if (stacks) {  // refused, not ignored
    std::fprintf(stderr,
                 "%s: --stacks: kvm record cannot keep off-CPU stacks (a .dat file has no place "
                 "for them); use kvm stat --bpf --stacks or kvm live --stacks\n",
                 self);
    return 2;
  }

  TracefsOptions opt;
  opt.tracefs_dir = tracefs_dir;
  opt.instance = instance;
  opt.top_level = top_level;
  if (!events.empty()) opt.events = events;
  if (!clock.empty()) opt.clocks = {clock};
  opt.buffer_kb = buffer_kb;
  opt.pid = pid;

  StopSignalScope signals;
  GatedChild child;
  if (!cmd.empty()) {
    auto spawned = child.Spawn(cmd);
    if (!spawned) return ReportError(self, spawned.error());
    opt.pid = *spawned;
  }

  auto session = TracefsSession::Open(opt);
  if (!session) return ReportError(self, session.error());
  TracefsSession& s = **session;
  if (!clock.empty() && s.clock() != clock) {
    std::fprintf(stderr, "%s: --clock %s: not offered by this kernel (%s/trace_clock)\n", self,
                 clock.c_str(), s.buffer_dir().c_str());
    return 2;
  }
  auto writer = TraceDatWriter::Create(output, s);
  if (!writer) return ReportError(self, writer.error());
  auto reader = TracefsPageReader::Open(s);
  if (!reader) return ReportError(self, reader.error());
  auto tep = TepEvents::Load(s.tracefs_dir(), s.systems());
  if (!tep) return ReportError(self, tep.error());
  RawPageDecoder decoder(tep->get());
  CountingSink counts;
  auto sink = [&](int cpu, const uint8_t* page, size_t size) -> Status {
    decoder.Decode(cpu, page, size, counts);
    return (*writer)->AddPage(cpu, page, size);
  };

  if (Status st = s.Start(); !st) return ReportError(self, st.error());
  const auto start = std::chrono::steady_clock::now();
  if (!cmd.empty()) {
    if (const int e = child.Go(); e != 0) {
      std::fprintf(stderr, "%s: cannot run '%s': %s\n", self, cmd[0].c_str(), std::strerror(e));
      return 2;  // the session and writer clean up (partial output removed)
    }
  }
  std::string why = "Ctrl-C";
  for (;;) {
    auto n = (*reader)->Poll(sink);
    if (!n) return ReportError(self, n.error());
    if (StopSignalScope::StopRequested()) {
      why = fmt::format("signal {}", StopSignalScope::LastSignal());
      break;
    }
    if (!cmd.empty() && child.Exited()) {
      why = fmt::format("'{}' {}", cmd[0], DescribeStatus(child.status()));
      break;
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (duration > 0 && elapsed >= duration) {
      why = fmt::format("{} s elapsed", duration);
      break;
    }
    ::usleep(static_cast<useconds_t>(poll_ms) * 1000);  // a signal cuts it short
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (Status st = s.Stop(); !st) return ReportError(self, st.error());
  for (int idle = 0; idle < 2;) {
    auto n = (*reader)->Poll(sink);
    if (!n) return ReportError(self, n.error());
    if (*n == 0) ++idle;
  }
  if (Status st = (*writer)->Finish(s.buffer_dir()); !st) return ReportError(self, st.error());
  (*reader)->Close();
  if (Status st = s.Close(); !st) return ReportError(self, st.error());
  if (!cmd.empty() && !child.Exited()) {
    const int sig = StopSignalScope::LastSignal();
    child.Stop(sig ? sig : SIGTERM);
  }

  std::string per_event;
  for (const auto& [id, n] : counts.by_type) {
    tep_event* ev = id >= 0 ? tep_find_event(tep->get(), id) : nullptr;
    per_event += fmt::format("{}{} {}", per_event.empty() ? "" : ", ", ev ? ev->name : "?", n);
  }
  std::printf(
      "%s: wrote %s: %llu events (%s) in %.1f s on %d CPUs, clock %s, lost %llu%s; "
      "stopped: %s\n",
      self, output.c_str(), static_cast<unsigned long long>(decoder.records()),
      per_event.empty() ? "none" : per_event.c_str(), elapsed, s.cpu_count(), s.clock().c_str(),
      static_cast<unsigned long long>(decoder.lost_events()),
      decoder.lost_unknown_pages()
          ? fmt::format(" (+{} pages with an unknown count)", decoder.lost_unknown_pages()).c_str()
          : "",
      why.c_str());
  return 0;
}

}  // namespace exitscope::cli
