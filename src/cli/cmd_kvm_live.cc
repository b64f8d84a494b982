// `exitscope kvm live`: the `exitscope kvm report` analysis on the running machine,
// refreshed every -d SECS, as `perf kvm stat live` does.
//
//   exitscope kvm live [-d SECS] [--stop-after SECS] [--event ...] [--vcpu N] [-p PID]
//                      [-k KEY] [--duration USEC] [--percentiles] [--per-vcpu] [--per-vm]
//                      [--histogram] [--format table|json|csv] [--device-map FILE]
//                      [--cumulative] [--metrics ADDR:PORT]
//
// Records come from tracefs raw per-CPU pages (a private instance, every setting restored on
// exit, Ctrl-C included), are decoded with kvm-analysis's KvmTepDecoder, paired into exits
// by KvmPairer and aggregated by KvmAggregator: the very code `kvm report` runs on a file.
// Pages are read every 10 ms; KvmLiveFeeder (sources/tracefs_kvm.h) merges them across CPUs
// in time order, 50 ms behind the newest record, so the per-thread order the pairer needs
// holds.
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "analysis/kvm_stats.h"
#include "cli/commands.h"
#include "cli/kvm_flags.h"
#include "cli/kvm_live_metrics.h"
#include "cli/parse_args.h"
#include "exitscope/metrics.h"
#include "fmt/format.h"
#include "report/kvm_report.h"
#include "sources/host_tsc.h"
#include "sources/kvm_device_map.h"
#include "sources/kvm_pairing.h"
#include "sources/kvm_trace.h"
#include "sources/tracecmd_dat.h"
#include "sources/tracefs_kvm.h"
#include "sources/tracefs_reader.h"
#include "sources/tracefs_session.h"

extern "C" {
#include <event-parse.h>
}

namespace exitscope::cli {
namespace {

using sources::StopSignalScope;

}  // namespace

int KvmLiveMain(int argc, char** argv) {
  const char* self = argc > 0 ? argv[0] : "exitscope kvm live";
  CLI::App app{
      "Show the `exitscope kvm report` analysis of the KVM exits happening now, "
      "refreshed every -d SECS, as perf kvm stat live does. Ctrl-C stops; tracefs "
      "is restored.",
      self};
  double interval = 1.0, stop_after = 0;
  std::string tracefs_dir;
  std::vector<std::string> events;
  KvmAnalysisFlags flags;
  bool cumulative = false, no_clear = false;
  size_t buffer_kb = 0;
  std::string metrics_listen;
  app.add_option("-d,--delay", interval, "refresh every SECS seconds (default 1)")
      ->check(NumberIn(0.05, 86'400, "s"));
  app.add_option("--stop-after", stop_after,
                 "stop after SECS seconds, 0..31536000 (default: Ctrl-C)")
      ->check(NumberIn(0, 31'536'000, "s"));
  flags.Add(app, "only this VM (VMM process id): also filters in the kernel",
            "list each exit that took at least USEC microseconds (the last 20 are shown)",
            "table | json | csv (json: one document per refresh)");
  app.add_flag("--cumulative", cumulative,
               "keep counting across refreshes (default: each "
               "refresh shows its interval only, as perf)");
  app.add_flag("--no-clear", no_clear, "do not clear the screen between refreshes");
  app.add_option("-e,--trace-event", events, "tracepoints to enable (default kvm:*)");
  app.add_option("--buffer-kb", buffer_kb, "per-CPU ring buffer size in KiB (1..4194304)")
      ->check(IntegerIn(1, 4'194'304, "KiB"));
  app.add_option("--tracefs", tracefs_dir,
                 "tracefs mount point (default: $EXITSCOPE_TRACEFS "
                 "or /sys/kernel/tracing)");
  app.add_option("--metrics", metrics_listen,
                 "also serve the exits as Prometheus metrics on http://ADDR:PORT/metrics "
                 "(:PORT = 127.0.0.1:PORT; docs/prometheus.md)");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  if (!metrics_listen.empty()) {
    if (auto l = ParseMetricsListen(metrics_listen); !l)
      return UsageError(self, "--" + l.error().message);
  }

  analysis::KvmAnalysisOptions aopts;
  report::KvmRenderOptions ropts;
  sources::KvmPairerOptions popts;
  std::unique_ptr<sources::KvmDeviceMap> devices;
  if (int rc = flags.Apply(self, &aopts, &ropts, &popts, &devices); rc != 0) return rc;
  const std::string& format = flags.format;
  const int64_t pid = flags.pid;

  sources::TracefsOptions topts;
  topts.tracefs_dir = tracefs_dir;
  if (!events.empty()) topts.events = events;
  topts.buffer_kb = buffer_kb;
  if (pid > 0) topts.pid = static_cast<pid_t>(pid);

  StopSignalScope signals;
  auto session = sources::TracefsSession::Open(topts);
  if (!session) return ReportError(self, session.error());
  sources::TracefsSession& s = **session;
  auto reader = sources::TracefsPageReader::Open(s);
  if (!reader) return ReportError(self, reader.error());
  auto tep = sources::TepEvents::Load(s.tracefs_dir(), s.systems());
  if (!tep) return ReportError(self, tep.error());

  const uint64_t tsc_khz = s.clock() == "x86-tsc" ? sources::HostTscKhz() : 0;
  popts.clock = sources::ScaleForClock(s.clock(), tsc_khz);
  // 50 ms in the capture clock's units.
  const uint64_t lag = tsc_khz ? tsc_khz * 50 : 50'000'000;

  std::deque<std::string> slow_lines;
  if (aopts.slow_ns != 0) {
    aopts.on_slow = [&](const ExitEvent& e, std::string_view k) {
      slow_lines.push_back(report::FormatKvmSlowExit(e, k));
      if (slow_lines.size() > 20) slow_lines.pop_front();
    };
  }
  analysis::KvmAggregator agg(aopts);
  std::unique_ptr<KvmLiveMetrics> metrics;  // a tee in front of the aggregator
  if (!metrics_listen.empty()) {
    auto m = KvmLiveMetrics::Start(metrics_listen, &agg, aopts.slow_ns, devices != nullptr);
    if (!m) return ReportError(self, Error{m.error().code, "--" + m.error().message});  // --metrics
    metrics = std::move(*m);
    std::fprintf(stderr, "exitscope kvm live: metrics on http://%s/metrics\n",
                 metrics->address().c_str());
  }
  sources::KvmPairer pairer(popts, metrics ? static_cast<EventSink*>(metrics.get()) : &agg);
  sources::KvmLiveFeeder merger(tep->get(), &pairer, lag);
  sources::RawPageDecoder pages(tep->get());
  auto sink = [&](int cpu, const uint8_t* page, size_t size) -> Status {
    pages.Decode(cpu, page, size, merger);
    return {};
  };

  report::KvmReportContext ctx;
  ctx.input = "live";
  ctx.format = "tracefs";
  ctx.clock = s.clock();
  ctx.tsc_khz = tsc_khz;
  ctx.tsc_khz_from_host = tsc_khz != 0;
  ctx.pairing = &pairer.stats();
  ctx.pid = pid;
  ctx.vcpu = flags.vcpu;
  const bool clear = format == "table" && !no_clear && ::isatty(STDOUT_FILENO);

  if (Status st = s.Start(); !st) return ReportError(self, st.error());
  const auto start = std::chrono::steady_clock::now();
  auto next_refresh = start + std::chrono::duration<double>(interval);
  int refresh = 0;
  auto render = [&](bool final_one) {
    agg.Finish();
    if (metrics) metrics->SetLostEvents(pages.lost_events());
    ++refresh;
    std::string out;
    if (format == "table") {
      if (clear) out += "\033[H\033[2J";
      std::time_t now = std::time(nullptr);
      char when[32];
      std::strftime(when, sizeof when, "%H:%M:%S", std::localtime(&now));
      out += fmt::format(
          "exitscope kvm live: {} {} #{} (every {} s{}), clock {}, lost {} "
          "events{}\n",
          final_one ? "final" : "refresh", when, refresh, interval,
          cumulative ? ", cumulative" : "", s.clock(), pages.lost_events(),
          pages.lost_unknown_pages()
              ? fmt::format(" (+{} pages with an unknown count)", pages.lost_unknown_pages())
              : "");
      out += report::RenderKvmTable(agg.analysis(), ctx, ropts);
      if (!slow_lines.empty()) {
        out += fmt::format("\nSlowest-threshold exits (>= {} us), latest {}:\n", flags.duration_us,
                           slow_lines.size());
        for (const std::string& l : slow_lines) out += l + "\n";
      }
    } else if (format == "json") {
      out = report::RenderKvmJson(agg.analysis(), ctx, ropts);
      while (!out.empty() && out.back() == '\n') out.pop_back();
      std::replace(out.begin(), out.end(), '\n', ' ');
      out += '\n';
    } else {
      out = report::RenderKvmCsv(agg.analysis(), ctx, ropts);
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    if (!cumulative) agg.Reset();
  };

  for (;;) {
    auto n = (*reader)->Poll(sink);
    if (!n) return ReportError(self, n.error());
    merger.Flush(false);
    if (StopSignalScope::StopRequested()) break;
    const auto now = std::chrono::steady_clock::now();
    if (stop_after > 0 && now - start >= std::chrono::duration<double>(stop_after)) break;
    if (now >= next_refresh) {
      render(false);
      next_refresh += std::chrono::duration<double>(interval);
      if (next_refresh < now) next_refresh = now + std::chrono::duration<double>(interval);
    }
    ::usleep(10'000);  // a signal cuts it short
  }
  (void)s.Stop();
  for (int idle = 0; idle < 2;) {
    auto n = (*reader)->Poll(sink);
    if (!n) break;
    if (*n == 0) ++idle;
  }
  merger.Flush(true);
  pairer.Finish();
  render(true);
  (*reader)->Close();
  if (Status st = s.Close(); !st) return ReportError(self, st.error());
  return 0;
}

}  // namespace exitscope::cli
