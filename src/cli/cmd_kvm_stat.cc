// `exitscope kvm stat`: KVM exit statistics aggregated in the kernel by an eBPF program.
//
//   exitscope kvm stat --bpf [--event ...] [-p PID] [--vcpu N] [-k KEY] [--percentiles]
//                      [--per-vcpu] [--per-vm] [--histogram] [--format table|json|csv]
//                      [--device-map FILE] [--pvm-numbering upstream|fork]
//                      [--duration S] [-d SECS] [--metrics ADDR:PORT]
//                      [--stacks [--slow MS] [--format html|timeline -o FILE]] [-- CMD ARGS...]
//
// The program (src/sources/bpf/kvm_stat.bpf.c) pairs the kvm tracepoints per vCPU thread as
// KvmPairer does and keeps per-key histograms in BPF maps: no event reaches userspace. This
// command reads the maps every -d SECS (cumulative) and at the end, and renders them with
// `kvm report`'s table / JSON / CSV. With CMD it starts CMD, counts its process and the
// processes it forks (followed in the kernel: a VMM behind a wrapper or a shell), and
// stops when CMD exits; else it runs for --duration S or until Ctrl-C. Without BPF (not built,
// no BTF, no permission, no kvm tracepoints) it says so in one line and streams the same
// tracepoints from tracefs instead, as `kvm live` does. --metrics serves the maps as
// Prometheus metrics, read at each scrape (kernel_metrics.h). docs/kvm-bpf.md.
// --stacks (docs/kvm-stacks.md): slow exits seen from the kernel with their stacks, printed as
// they end and kept (the slowest, analysis/offcpu_exits.h) for the final report's section;
// --format html|timeline -o FILE writes only that final report (slow exits on stderr).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "analysis/bpf_kvm_rows.h"
#include "analysis/kvm_stats.h"
#include "cli/commands.h"
#include "cli/gated_child.h"
#include "cli/kernel_metrics.h"
#include "cli/kvm_flags.h"
#include "cli/offcpu_output.h"
#include "cli/parse_args.h"
#include "cli/report_pipeline.h"
#include "exitscope/metrics.h"
#include "fmt/format.h"
#include "report/format.h"
#include "report/kvm_report.h"
#include "report/offcpu_report.h"
#include "report/renderer.h"
#include "sources/bpf/bpf_kvm_stat.h"
#include "sources/bpf/bpf_offcpu_stacks.h"
#include "sources/kvm_device_map.h"
#include "sources/kvm_pairing.h"
#include "sources/tracefs_live.h"

namespace exitscope::cli {
namespace {

using sources::StopSignalScope;

struct StatRun {
  const char* self = "";
  KvmAnalysisFlags flags;
  double interval = 0;  // -d: 0 = only at the end
  double duration = 0;  // --duration: 0 = until CMD exits / Ctrl-C
  std::vector<std::string> cmd;
  std::string tracefs_dir;
  bool bpf_stats = false;                           // --bpf-stats
  std::string metrics_listen;                       // --metrics
  std::string bpf_attach = "auto";                  // --bpf-attach
  std::string bpf_pairing = "auto";                 // --bpf-pairing
  bool stacks = false;                              // --stacks
  double slow_ms = 20;                              // --slow (with --stacks)
  sources::bpf::BpfOffCpuStacks* offcpu = nullptr;  // --stacks: open while RunBpf runs
  std::unique_ptr<sources::bpf::OffCpuSymbolizer> offcpu_sym;
  size_t offcpu_notes = 0;                          // the symbolizer's notes printed so far
  std::unique_ptr<analysis::OffCpuSlowExits> kept;  // --stacks: for the final report
  std::string output;                               // -o: the html / timeline file
  bool file_format = false;                         // --format html | timeline
  analysis::KvmAnalysisOptions aopts;
  report::KvmRenderOptions ropts;
  sources::KvmPairerOptions popts;
  GatedChild child;
  std::string stopped;
};

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

// Waits until the next refresh, the end of --duration, CMD's exit or Ctrl-C; polls `tick`
// every 10 ms. Returns true when the run is over. `once`: checks once and returns (a live
// source's tick, which reads and sleeps itself).
template <typename Tick, typename Refresh>
bool Wait(StatRun& run, std::chrono::steady_clock::time_point start,
          std::chrono::steady_clock::time_point* next_refresh, Tick&& tick, Refresh&& refresh,
          bool once = false) {
  for (;;) {
    if (!tick()) return true;
    if (StopSignalScope::StopRequested()) {
      run.stopped = fmt::format("signal {}", StopSignalScope::LastSignal());
      return true;
    }
    if (!run.cmd.empty() && run.child.Exited()) {
      run.stopped = fmt::format("'{}' {}", run.cmd[0], DescribeStatus(run.child.status()));
      return true;
    }
    const auto now = std::chrono::steady_clock::now();
    if (run.duration > 0 && now - start >= std::chrono::duration<double>(run.duration)) {
      run.stopped = fmt::format("after {} s", run.duration);
      return true;
    }
    if (run.interval > 0 && now >= *next_refresh) {
      refresh();
      *next_refresh += Seconds(run.interval);
      if (*next_refresh < now) *next_refresh = now + Seconds(run.interval);
    }
    if (once) return false;  // the caller sleeps (TracefsLiveSource's tick)
    ::usleep(10'000);        // a signal cuts it short
  }
}

// One refresh by the --format renderer (a live one: table, json on one line, csv).
std::string Render(const analysis::KvmAnalysis& a, const report::KvmReportContext& ctx,
                   const report::KvmRenderOptions& ropts, const std::string& format) {
  report::KvmModel k{.analysis = &a, .context = ctx, .render = ropts};
  auto r = report::FindRenderer(format, report::Need::kLive);  // validated by the flags
  auto text = report::RenderText(**r, {.kvm = &k});
  std::string out = text ? std::move(*text) : text.error().message + "\n";
  if (format == "json") {
    while (!out.empty() && out.back() == '\n') out.pop_back();
    std::replace(out.begin(), out.end(), '\n', ' ');
    out += '\n';
  }
  return out;
}

int StartChild(StatRun& run) {
  if (run.cmd.empty()) return 0;
  if (const int e = run.child.Go(); e != 0) {
    return ReportError(run.self,
                       Error{ErrorCode::kNotFound,
                             fmt::format("cannot run '{}': {}", run.cmd[0], std::strerror(e))});
  }
  return 0;
}

void StopChild(StatRun& run) {
  if (run.cmd.empty() || run.child.Exited()) return;
  const int sig = StopSignalScope::LastSignal();
  run.child.Stop(sig ? sig : SIGTERM);
}

// --stacks: the slow exits that ended since the last call, printed now (text, or one JSON
// object a line; with a file format one line each on stderr) and kept for the final report.
// `stuck`: also the exits in flight, with where their threads are now (a refresh); `at_end`:
// those are kept for the final report instead ("Stuck at the end"), not printed.
Status PrintOffCpu(StatRun& run, bool stuck, bool at_end = false) {
  if (run.offcpu == nullptr) return {};
  const bool json = run.flags.format == "json";
  auto ended = TakeOffCpuEnded(*run.offcpu, *run.offcpu_sym);
  if (!ended) return Propagate(ended);
  std::string out, err;
  for (analysis::OffCpuSlowExit& e : *ended) {
    if (run.file_format) {
      err += fmt::format("{}: slow exit: tid {} (pid {}) {}\n", run.self, e.exit.tid, e.exit.tgid,
                         report::OffCpuExitHeadline(e));
    } else {
      out += OffCpuLive(e, json);
    }
    run.kept->Add(std::move(e));
  }
  if (stuck) {
    auto now =
        OffCpuStuckNow(*run.offcpu, *run.offcpu_sym, static_cast<uint64_t>(run.slow_ms * 1e6));
    if (!now) return Propagate(now);
    for (analysis::OffCpuSlowExit& e : *now) {
      if (at_end) {
        run.kept->Add(std::move(e));
      } else if (!run.file_format) {
        out += OffCpuLive(e, json);
      }
    }
  }
  if (!json && !run.file_format && !at_end)
    out += NewOffCpuNotes(*run.offcpu_sym, &run.offcpu_notes);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  std::fwrite(err.data(), 1, err.size(), stderr);
  return {};
}

// --bpf: the in-kernel aggregation.
int RunBpf(StatRun& run, sources::bpf::BpfKvmStat& bpf) {
  const std::string& format = run.flags.format;
  analysis::BpfKvmRowOptions bo;
  bo.analysis = run.aopts;
  bo.pvm = run.popts.pvm;
  bo.devices = run.popts.devices;
  report::KvmReportContext ctx;
  ctx.input = run.cmd.empty() ? "live" : run.cmd[0];
  ctx.format = "eBPF in-kernel aggregation (kvm stat --bpf)";
  ctx.clock = "mono";
  ctx.pid = run.flags.pid;
  ctx.vcpu = run.flags.vcpu;
  int refresh = 0;
  const analysis::KvmAggregator keys(run.aopts);  // the rows' keys, for the diagnosis
  const auto began = std::chrono::steady_clock::now();
  auto print = [&](const sources::bpf::BpfKvmSnapshot& snap, bool final_one) -> Status {
    bo.final = final_one;
    analysis::DiagnosisBuilder diag(analysis::KvmDiagnosisOptions(keys));
    bo.also = &diag;
    analysis::BpfKvmRows rows = analysis::BuildBpfKvmRows(snap, bo);
    ctx.pairing = &rows.pairing;
    const analysis::Diagnosis diagnosis =
        diag.Finish(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::steady_clock::now() - began)
                                              .count()));
    ctx.diagnosis = &diagnosis;
    ctx.diagnosis_text = KvmDiagnosisText(keys, false);
    ctx.diagnosis_text.slow_rule =
        "not told apart: the eBPF maps keep each key's distribution, not single exits";
    ctx.offcpu = nullptr;
    if (final_one && run.kept != nullptr) {  // --stacks: the slow exits seen from the kernel
      run.kept->SetNotes(run.offcpu_sym->notes());
      ctx.offcpu = run.kept.get();
      ctx.diagnosis_text.seen_from_kernel = report::OffCpuDiagnosisLine(*run.kept);
    }
    ++refresh;
    if (run.file_format) {  // --format html | timeline: only the final report, into -o FILE
      if (!final_one) return Status{};
      report::KvmModel k{.analysis = &rows.analysis, .context = ctx, .render = run.ropts};
      auto r = report::FindRenderer(format, report::Need::kFile);  // validated by the flags
      if (Status st = report::WriteReport(**r, {.kvm = &k}, run.output); !st) return st;
      std::fprintf(stderr, "%s: wrote %s (%s): %llu slow exits seen from the kernel%s\n", run.self,
                   run.output == "-" ? "standard output" : run.output.c_str(), format.c_str(),
                   static_cast<unsigned long long>(run.kept->seen()),
                   run.stopped.empty() ? "" : ("; stopped: " + run.stopped).c_str());
      return Status{};
    }
    std::string out;
    if (format == "table") {
      out += fmt::format(
          "exitscope kvm stat --bpf: {} #{}{}, {} keys, {} records, lost {} samples and {} "
          "records{}{}\n",
          final_one ? "final" : "refresh", refresh,
          run.interval > 0 ? fmt::format(" (every {} s, cumulative)", run.interval) : "", rows.keys,
          rows.pairing.records_total, rows.lost_samples, rows.lost_records,
          snap.counters.no_vcpu == 0
              ? ""
              : fmt::format("; {} exits without their vCPU's kvm_run (counted, no access)",
                            snap.counters.no_vcpu),
          final_one && !run.stopped.empty() ? "; stopped: " + run.stopped : "");
    }
    out += Render(rows.analysis, ctx, run.ropts, format);
    if (format == "table" && !final_one && !rows.in_flight.empty()) {
      out += fmt::format("\nIn flight now: {} exits (the vCPU has not re-entered the guest):\n",
                         rows.in_flight.size());
      for (const analysis::BpfKvmInFlight& f : rows.in_flight) {
        out += fmt::format("  VM {} vCPU {} (tid {}): {} {}{} inside for {:.3f} ms\n", f.exit.vm,
                           f.exit.vcpu, f.exit.tid, f.exit.reason, f.exit.key,
                           f.exit.device.empty() ? "" : fmt::format(" ({})", f.exit.device),
                           static_cast<double>(f.inside_ns) / 1e6);
      }
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    // --stacks: the exits stuck now, with where their threads are (the in-flight view).
    if (run.offcpu != nullptr && !final_one) {
      if (Status st = PrintOffCpu(run, true); !st)
        std::fprintf(stderr, "%s: --stacks: %s\n", run.self, st.error().message.c_str());
    }
    return Status{};
  };

  std::unique_ptr<KernelMetrics> metrics;  // reads the maps at each scrape
  if (!run.metrics_listen.empty()) {
    auto m = KernelMetrics::StartBpf(run.metrics_listen, &bpf, bo, run.popts.devices != nullptr);
    if (!m) return ReportError(run.self, Error{m.error().code, "--" + m.error().message});
    metrics = std::move(*m);
    std::fprintf(stderr, "%s: metrics on http://%s/metrics\n", run.self,
                 metrics->address().c_str());
  }
  if (run.bpf_stats) {
    if (Status st = bpf.EnableRunTimeStats(); !st) {
      std::fprintf(stderr, "%s: --bpf-stats: %s\n", run.self, st.error().message.c_str());
    }
  }
  if (int rc = StartChild(run); rc != 0) return rc;
  const auto start = std::chrono::steady_clock::now();
  auto next_refresh = start + Seconds(run.interval);
  Status failure;
  Wait(
      run, start, &next_refresh,
      [&] {
        // --stacks: slow exits are printed as they end (within the 10 ms poll).
        if (run.offcpu != nullptr) {
          if (Status st = PrintOffCpu(run, false); !st) failure = st;
        }
        return static_cast<bool>(failure);
      },
      [&] {
        auto snap = bpf.Read();
        if (!snap) {
          failure = Propagate(snap);
          return;
        }
        if (Status st = print(*snap, false); !st) failure = st;
      });
  const sources::bpf::BpfKvmStat::RunTime rt = bpf.ProgramRunTime();
  bpf.Detach();
  if (run.offcpu != nullptr && failure) {
    // The exits that ended, and those still stuck at the end (kept for the final report),
    // before CMD is stopped.
    if (Status st = PrintOffCpu(run, true, /*at_end=*/true); !st) failure = st;
    run.offcpu->Detach();
  }
  StopChild(run);
  if (run.bpf_stats && rt.runs != 0) {
    std::fprintf(stderr,
                 "%s: BPF programs ran %llu times, %.1f ns per run (kernel run time); attached "
                 "as %s\n",
                 run.self, static_cast<unsigned long long>(rt.runs),
                 static_cast<double>(rt.ns) / static_cast<double>(rt.runs),
                 bpf.attachment().c_str());
  }
  if (!failure) return ReportError(run.self, failure.error());
  auto snap = bpf.Read();
  if (!snap) return ReportError(run.self, snap.error());
  if (Status st = print(*snap, true); !st) return ReportError(run.self, st.error());
  return 0;
}

// Without BPF: the tracepoints streamed from tracefs and paired in userspace (`kvm live`).
int RunTracefs(StatRun& run) {
  const std::string& format = run.flags.format;
  sources::TracefsOptions topts;
  topts.tracefs_dir = run.tracefs_dir;
  if (run.flags.pid > 0) topts.pid = static_cast<pid_t>(run.flags.pid);
  if (!run.cmd.empty()) topts.pid = run.child.pid();
  auto opened = sources::TracefsLiveSource::Open(topts, run.popts);
  if (!opened) return ReportError(run.self, opened.error());
  sources::TracefsLiveSource& src = **opened;

  analysis::KvmAggregator agg(run.aopts);
  std::unique_ptr<KernelMetrics> metrics;  // a tee in front of the aggregator, as kvm live
  if (!run.metrics_listen.empty()) {
    auto m = KernelMetrics::Start(run.metrics_listen, &agg, 0, run.popts.devices != nullptr);
    if (!m) return ReportError(run.self, Error{m.error().code, "--" + m.error().message});
    metrics = std::move(*m);
    std::fprintf(stderr, "%s: metrics on http://%s/metrics\n", run.self,
                 metrics->address().c_str());
  }
  report::KvmReportContext ctx;
  ctx.input = run.cmd.empty() ? "live" : run.cmd[0];
  ctx.format = src.info().format;
  ctx.clock = src.info().clock;
  ctx.tsc_khz = src.info().tsc_khz;
  ctx.tsc_khz_from_host = src.info().tsc_khz_from_host;
  ctx.pairing = src.pairing();
  ctx.pid = run.flags.pid;
  ctx.vcpu = run.flags.vcpu;
  int refresh = 0;
  analysis::DiagnosisBuilder diag(analysis::KvmDiagnosisOptions(agg));
  TeeSink tee({metrics ? static_cast<EventSink*>(metrics.get()) : &agg, &diag});
  auto print = [&](bool final_one) {
    agg.Finish();
    const analysis::Diagnosis diagnosis = diag.Finish();
    ctx.diagnosis = &diagnosis;
    ctx.diagnosis_text = KvmDiagnosisText(agg, false);
    ++refresh;
    std::string out;
    if (format == "table") {
      out +=
          fmt::format("exitscope kvm stat (tracefs): {} #{}, clock {}, lost {} events{}\n",
                      final_one ? "final" : "refresh", refresh, src.info().clock, src.lost_events(),
                      final_one && !run.stopped.empty() ? "; stopped: " + run.stopped : "");
    }
    out += Render(agg.analysis(), ctx, run.ropts, format);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  };

  const auto start = std::chrono::steady_clock::now();
  auto next_refresh = start + Seconds(run.interval);
  int child_rc = 0;  // StartChild printed why
  src.SetControl({.started = [&]() -> Status {
                    child_rc = StartChild(run);
                    if (child_rc != 0) return Fail(ErrorCode::kNotFound, "CMD did not start");
                    return {};
                  },
                  .tick =
                      [&] {
                        if (metrics) metrics->SetLostEvents(src.lost_events());
                        return !Wait(
                            run, start, &next_refresh, [] { return true; }, [&] { print(false); },
                            /*once=*/true);
                      }});
  Status failure = src.Run(&tee);
  StopChild(run);
  if (!failure) {
    if (child_rc != 0) return child_rc;
    return ReportError(run.self, failure.error());
  }
  print(true);
  return 0;
}

}  // namespace

int KvmStatMain(int argc, char** argv) {
  StatRun run;
  run.self = argc > 0 ? argv[0] : "exitscope kvm stat";
  int own_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      own_argc = i;
      for (int j = i + 1; j < argc; ++j) run.cmd.emplace_back(argv[j]);
      break;
    }
  }
  CLI::App app{
      "KVM exit statistics aggregated in the kernel by an eBPF program (--bpf): per-key counts "
      "and latency histograms in BPF maps, no event streamed to userspace. Prints `exitscope "
      "kvm report`'s table at the end (and every -d SECS). Without BPF it says so in one line "
      "and streams the tracepoints from tracefs instead (as `kvm live`). With -- CMD it counts "
      "CMD and every process CMD forks (a VMM started by a shell or a wrapper). "
      "docs/kvm-bpf.md.\n"
      "usage: exitscope kvm stat --bpf [options] [-- CMD ARGS...]",
      run.self};
  bool use_bpf = false;
  KvmAnalysisFlags& f = run.flags;
  app.add_flag("--bpf", use_bpf,
               "aggregate in the kernel (eBPF on the kvm tracepoints); without it, or where "
               "BPF is not possible, tracefs streaming");
  app.add_option("--event", f.event, "vmexit | userspace | ioport | mmio | msr | hypercall");
  app.add_option("--vcpu", f.vcpu, "only this vCPU")->check(kNonNegativeInteger);
  app.add_option("-p,--pid", f.pid, "only this VM (VMM process id): also filters in the kernel")
      ->check(kNonNegativeInteger);
  app.add_option("-k,--key", f.key,
                 "sort rows by: sample | time | max | min | avg | p50 | p99 | p999");
  app.add_flag("--percentiles", f.percentiles, "add p50 / p99 / p99.9 columns");
  app.add_flag("--per-vcpu", f.per_vcpu, "add one table per vCPU");
  app.add_flag("--per-vm", f.per_vm, "add one table per VM");
  app.add_flag("--histogram", f.histogram, "log-scale latency histogram per row");
  app.add_option("--format", f.format,
                 "table | json | csv (json: one document per line); with --stacks also html | "
                 "timeline, the final report only, into -o FILE");
  app.add_option("-o,--output", run.output,
                 "with --format html | timeline: the file of the final report (- is stdout)");
  app.add_option("--device-map", f.device_map,
                 "resolve ports / MMIO addresses: a recorder dump of the VM or a device-map "
                 "text file (docs/kvm.md)");
  app.add_option("--pvm-numbering", f.pvm_numbering,
                 "PVM exit reason numbering: upstream | fork (ERETS removed)");
  app.add_option("--duration", run.duration,
                 "stop after S seconds, 0..31536000 (default: when CMD exits, or Ctrl-C)")
      ->check(NumberIn(0, 31'536'000, "s"));
  app.add_option("-d,--delay", run.interval,
                 "also print the (cumulative) table every SECS seconds (default: at the end "
                 "only)")
      ->check(NumberIn(0, 86'400, "s"));
  app.add_flag("--bpf-stats", run.bpf_stats,
               "print the programs' own run time per tracepoint hit at the end (the kernel's "
               "BPF_ENABLE_STATS, on for this run only)");
  app.add_option("--metrics", run.metrics_listen,
                 "also serve the exits as Prometheus metrics on http://ADDR:PORT/metrics, read "
                 "from the maps at each scrape (:PORT = 127.0.0.1:PORT; docs/prometheus.md)");
  app.add_option("--bpf-attach", run.bpf_attach,
                 "auto | tp_btf | tracepoint: BTF-typed raw tracepoints where the kernel's "
                 "prototypes allow (auto falls back to classic tracepoints if refused), or "
                 "classic tracepoints only")
      ->check(CLI::IsMember({"auto", "tp_btf", "tracepoint"}));
  app.add_option("--bpf-pairing", run.bpf_pairing,
                 "auto | kvm-run | tracepoints: userspace exits from kvm_userspace_exit to the "
                 "next kvm_fpu load, read from the vCPU's kvm_run (three program runs per exit; "
                 "hosts where kvm_exit never fires, e.g. kvm-pvm: auto's choice there), or "
                 "paired from every kvm tracepoint as kvm report pairs them (docs/kvm-bpf.md)")
      ->check(CLI::IsMember({"auto", "kvm-run", "tracepoints"}));
  app.add_flag("--stacks", run.stacks,
               "with --bpf: where vCPU threads inside an exit went off the CPU (kernel and user "
               "stacks at sched_switch); exits slower than --slow printed as they end, with their "
               "stacks, and those stuck now at each refresh (docs/kvm-stacks.md)");
  app.add_option("--slow", run.slow_ms,
                 "with --stacks: a slow exit lasts this long or longer, ms (default 20)")
      ->check(NumberIn(1, 3600000, "ms"));
  app.add_option("--tracefs", run.tracefs_dir,
                 "tracefs mount point (default: $EXITSCOPE_TRACEFS or /sys/kernel/tracing)");
  if (auto rc = ParseArgs(app, own_argc, argv)) return *rc;
  if (!run.metrics_listen.empty()) {
    if (auto l = ParseMetricsListen(run.metrics_listen); !l)
      return UsageError(run.self, "--" + l.error().message);
  }
  if (f.pid > 0 && !run.cmd.empty()) {
    return UsageError(run.self, "-p and a command after -- exclude each other");
  }
  if (run.stacks && !use_bpf) return UsageError(run.self, "--stacks needs --bpf");
  if (run.stacks && f.format == "csv") {
    return UsageError(run.self, "--stacks prints with --format table or json, not csv");
  }
  run.file_format = f.format == "html" || f.format == "timeline";
  if (run.file_format && !run.stacks) {
    return UsageError(run.self, fmt::format("--format {} needs --bpf --stacks (the slow exits "
                                            "seen from the kernel are what it draws)",
                                            f.format));
  }
  if (run.file_format && run.output.empty()) {
    return UsageError(run.self, fmt::format("--format {} needs -o FILE", f.format));
  }
  if (!run.file_format && !run.output.empty()) {
    return UsageError(run.self, "-o is for --format html or timeline");
  }
  f.html_format = run.file_format;  // every format is checked below; the live ones otherwise
  std::unique_ptr<sources::KvmDeviceMap> devices;
  if (int rc = f.Apply(run.self, &run.aopts, &run.ropts, &run.popts, &devices); rc != 0) {
    return rc;
  }
  run.aopts.slow_ns = 0;  // --duration is the run's length here, not perf's slow-exit filter

  StopSignalScope signals;
  if (!run.cmd.empty()) {
    auto spawned = run.child.Spawn(run.cmd);
    if (!spawned) return ReportError(run.self, spawned.error());
  }
  if (use_bpf) {
    sources::bpf::BpfKvmOptions bo;
    bo.tracefs_dir = run.tracefs_dir;
    if (f.pid > 0) bo.tgid = static_cast<uint32_t>(f.pid);
    if (!run.cmd.empty()) {
      bo.tgid = static_cast<uint32_t>(run.child.pid());
      bo.follow_children = true;  // CMD's children too, as the tracefs path (event-fork)
    }
    bo.attach = run.bpf_attach == "tp_btf"       ? sources::bpf::BpfAttach::kTpBtf
                : run.bpf_attach == "tracepoint" ? sources::bpf::BpfAttach::kTracepoint
                                                 : sources::bpf::BpfAttach::kAuto;
    bo.pairing = run.bpf_pairing == "kvm-run"       ? sources::bpf::BpfPairing::kKvmRun
                 : run.bpf_pairing == "tracepoints" ? sources::bpf::BpfPairing::kTracepoints
                                                    : sources::bpf::BpfPairing::kAuto;
    // The kvm-run pairing counts accesses handled in the kernel only for the table's kind.
    using analysis::KvmEventClass;
    const KvmEventClass ev = run.aopts.event;
    bo.access_kinds = ev == KvmEventClass::kIoport      ? 1u << KS_SUB_PORT
                      : ev == KvmEventClass::kMmio      ? 1u << KS_SUB_MMIO
                      : ev == KvmEventClass::kMsr       ? 1u << KS_SUB_MSR
                      : ev == KvmEventClass::kHypercall ? 1u << KS_SUB_HYPERCALL
                                                        : 0u;
    auto bpf = sources::bpf::BpfKvmStat::Open(bo);
    if (!bpf && run.stacks) {
      // Refused, not ignored: the tracefs fallback has no stacks.
      std::fprintf(stderr, "%s: --bpf not possible here: %s; --stacks needs it\n", run.self,
                   bpf.error().message.c_str());
      return 1;
    }
    std::unique_ptr<sources::bpf::BpfOffCpuStacks> offcpu;
    if (bpf && run.stacks) {
      auto o = sources::bpf::BpfOffCpuStacks::Open(
          {.tgid = bo.tgid, .slow_ns = static_cast<uint64_t>(run.slow_ms * 1e6)});
      if (!o) {
        std::fprintf(stderr, "%s: --bpf not possible here: %s; --stacks needs it\n", run.self,
                     o.error().message.c_str());
        return 1;
      }
      offcpu = std::move(*o);
      run.offcpu = offcpu.get();
      run.offcpu_sym = std::make_unique<sources::bpf::OffCpuSymbolizer>();
      run.kept = std::make_unique<analysis::OffCpuSlowExits>(analysis::OffCpuSlowExitsOptions{
          .max_exits = 1000, .slow_ns = static_cast<uint64_t>(run.slow_ms * 1e6)});
    }
    if (bpf) return RunBpf(run, **bpf);
    std::fprintf(stderr, "%s: --bpf not possible here: %s; streaming from tracefs instead\n",
                 run.self, bpf.error().message.c_str());
  }
  return RunTracefs(run);
}

}  // namespace exitscope::cli
