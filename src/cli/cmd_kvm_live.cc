// `exitscope kvm live`: the `exitscope kvm report` analysis on the running machine,
// refreshed every -d SECS, as `perf kvm stat live` does.
//
//   exitscope kvm live [-d SECS] [--stop-after SECS] [--event ...] [--vcpu N] [-p PID]
//                      [-k KEY] [--duration USEC] [--percentiles] [--per-vcpu] [--per-vm]
//                      [--histogram] [--format table|json|csv] [--device-map FILE]
//                      [--cumulative] [--metrics ADDR:PORT] [--stacks [--slow MS]]
//
// Exits come from sources::TracefsLiveSource (tracefs raw per-CPU pages, a private instance,
// every setting restored on exit, Ctrl-C included; paired by KvmPairer), are aggregated by
// KvmAggregator and rendered by the --format renderer (report/renderer.h): the very code
// `kvm report` runs on a file. --stacks loads the off-CPU stacks program next to it
// (sources/bpf/bpf_offcpu_stacks.h, docs/kvm-stacks.md): slow exits with where their thread
// spent its time off the CPU, and the exits stuck now, under each refresh.
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
#include "cli/kernel_metrics.h"
#include "cli/kvm_flags.h"
#include "cli/offcpu_output.h"
#include "cli/parse_args.h"
#include "cli/report_pipeline.h"
#include "exitscope/metrics.h"
#include "fmt/format.h"
#include "report/kvm_report.h"
#include "report/renderer.h"
#include "sources/bpf/bpf_offcpu_stacks.h"
#include "sources/kvm_device_map.h"
#include "sources/kvm_pairing.h"
#include "sources/tracefs_live.h"

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
  bool stacks = false;
  double slow_ms = 20;
  app.add_flag("--stacks", stacks,
               "also where vCPU threads inside an exit went off the CPU (kernel and user stacks, "
               "eBPF on sched_switch): exits slower than --slow with their stacks, and those "
               "stuck now, under each refresh (docs/kvm-stacks.md)");
  app.add_option("--slow", slow_ms,
                 "with --stacks: a slow exit lasts this long or longer, ms (default 20)")
      ->check(NumberIn(1, 3600000, "ms"));
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  if (stacks && flags.format == "csv") {
    return UsageError(self, "--stacks prints with --format table or json, not csv");
  }
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

  const report::Renderer* renderer = *report::FindRenderer(format, report::Need::kLive);

  sources::TracefsOptions topts;
  topts.tracefs_dir = tracefs_dir;
  if (!events.empty()) topts.events = events;
  topts.buffer_kb = buffer_kb;
  if (pid > 0) topts.pid = static_cast<pid_t>(pid);

  // --stacks: refused in one line where the program cannot load, never ignored.
  std::unique_ptr<sources::bpf::BpfOffCpuStacks> offcpu;
  sources::bpf::OffCpuSymbolizer offcpu_sym;
  size_t offcpu_notes = 0;
  const uint64_t slow_stack_ns = static_cast<uint64_t>(slow_ms * 1e6);
  if (stacks) {
    auto o = sources::bpf::BpfOffCpuStacks::Open(
        {.tgid = pid > 0 ? static_cast<uint32_t>(pid) : 0u, .slow_ns = slow_stack_ns});
    if (!o) {
      std::fprintf(stderr, "%s: --stacks not possible here: %s\n", self, o.error().message.c_str());
      return 1;
    }
    offcpu = std::move(*o);
  }
  std::deque<std::string> slow_stacks;  // the latest slow exits with their stacks

  StopSignalScope signals;
  auto opened = sources::TracefsLiveSource::Open(topts, popts);
  if (!opened) return ReportError(self, opened.error());
  sources::TracefsLiveSource& src = **opened;

  std::deque<std::string> slow_lines;
  if (aopts.slow_ns != 0) {
    aopts.on_slow = [&](const ExitEvent& e, std::string_view k) {
      slow_lines.push_back(report::FormatKvmSlowExit(e, k));
      if (slow_lines.size() > 20) slow_lines.pop_front();
    };
  }
  analysis::KvmAggregator agg(aopts);
  std::unique_ptr<KernelMetrics> metrics;  // a tee in front of the aggregator
  if (!metrics_listen.empty()) {
    auto m = KernelMetrics::Start(metrics_listen, &agg, aopts.slow_ns, devices != nullptr);
    if (!m) return ReportError(self, Error{m.error().code, "--" + m.error().message});
    metrics = std::move(*m);
    std::fprintf(stderr, "exitscope kvm live: metrics on http://%s/metrics\n",
                 metrics->address().c_str());
  }

  report::KvmModel model;
  model.analysis = &agg.analysis();
  model.context.input = "live";
  model.context.format = src.info().format;
  model.context.clock = src.info().clock;
  model.context.tsc_khz = src.info().tsc_khz;
  model.context.tsc_khz_from_host = src.info().tsc_khz_from_host;
  model.context.pairing = src.pairing();
  model.context.pid = pid;
  model.context.vcpu = flags.vcpu;
  model.render = ropts;
  const bool clear = format == "table" && !no_clear && ::isatty(STDOUT_FILENO);

  int refresh = 0;
  Status failure;
  analysis::DiagnosisBuilder diag(analysis::KvmDiagnosisOptions(agg));
  TeeSink tee({metrics ? static_cast<EventSink*>(metrics.get()) : &agg, &diag});
  auto render = [&](bool final_one) {
    agg.Finish();
    const analysis::Diagnosis diagnosis = diag.Finish();
    model.context.diagnosis = &diagnosis;
    model.context.diagnosis_text = KvmDiagnosisText(agg, false);
    if (metrics) metrics->SetLostEvents(src.lost_events());
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
          cumulative ? ", cumulative" : "", src.info().clock, src.lost_events(),
          src.lost_unknown_pages()
              ? fmt::format(" (+{} pages with an unknown count)", src.lost_unknown_pages())
              : "");
    }
    auto text = report::RenderText(*renderer, {.kvm = &model});
    if (!text) {
      failure = Propagate(text);
      return;
    }
    out += *text;
    if (format == "table" && !slow_lines.empty()) {
      out += fmt::format("\nSlowest-threshold exits (>= {} us), latest {}:\n", flags.duration_us,
                         slow_lines.size());
      for (const std::string& l : slow_lines) out += l + "\n";
    }
    if (format == "json") {  // one document per line
      while (!out.empty() && out.back() == '\n') out.pop_back();
      std::replace(out.begin(), out.end(), '\n', ' ');
      out += '\n';
    }
    if (offcpu) {  // --stacks: JSON, one object a line after the document
      auto ended = OffCpuEnded(*offcpu, offcpu_sym, format == "json");
      auto stuck = OffCpuStuck(*offcpu, offcpu_sym, format == "json", slow_stack_ns);
      if (!ended) {
        failure = Propagate(ended);
        return;
      }
      if (!stuck) {
        failure = Propagate(stuck);
        return;
      }
      if (format == "json") {
        for (const std::string& e : *ended) out += e;
        out += *stuck;
      } else {
        for (std::string& e : *ended) slow_stacks.push_back(std::move(e));
        while (slow_stacks.size() > 5) slow_stacks.pop_front();
        if (!slow_stacks.empty()) {
          out += fmt::format("\nSlow exits (>= {} ms) with their stacks, latest {}:\n", slow_ms,
                             slow_stacks.size());
          for (const std::string& e : slow_stacks) out += e;
        }
        if (!stuck->empty())
          out += "\nExits stuck now (>= " + fmt::format("{}", slow_ms) + " ms):\n" + *stuck;
        offcpu_notes = 0;  // the screen is redrawn: every note, every refresh
        out += NewOffCpuNotes(offcpu_sym, &offcpu_notes);
      }
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    if (!cumulative) {
      agg.Reset();
      diag = analysis::DiagnosisBuilder(analysis::KvmDiagnosisOptions(agg));
    }
  };

  const auto start = std::chrono::steady_clock::now();
  auto next_refresh = start + std::chrono::duration<double>(interval);
  src.SetControl({.tick = [&] {
    if (StopSignalScope::StopRequested()) return false;
    const auto now = std::chrono::steady_clock::now();
    if (stop_after > 0 && now - start >= std::chrono::duration<double>(stop_after)) return false;
    if (now >= next_refresh) {
      render(false);
      next_refresh += std::chrono::duration<double>(interval);
      if (next_refresh < now) next_refresh = now + std::chrono::duration<double>(interval);
    }
    return true;
  }});
  if (Status st = src.Run(&tee); !st) return ReportError(self, st.error());
  render(true);
  if (!failure) return ReportError(self, failure.error());
  return 0;
}

}  // namespace exitscope::cli
