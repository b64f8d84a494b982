// `exitscope run`: the reference VMM. Boots a guest on /dev/kvm in user64 mode with a 16550
// UART, an NVMe-style block device and a debug-exit port, records every userspace exit and
// prints the exit-health report at the end.
//
//   exitscope run [--vcpus N] [--guest NAME|PATH] [--serial PATH] [--disk PATH]
//                 [--inject SPEC]... [--slow MS] [--dump PATH] [--duration SECONDS]
//                 [--no-record] [--no-stacks] [--format table|json|csv|html|timeline] [-o FILE]
//                 [--list-guests]
//                 [--metrics ADDR:PORT [--linger SECONDS]]
//
// Exit status: 0 the guest passed (or --duration stopped it without a failure), 1 the guest
// failed, a fatal guest error or no /dev/kvm, 2 bad usage.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/commands.h"
#include "cli/parse_args.h"
#include "cli/report_pipeline.h"
#include "exitscope/dump.h"
#include "exitscope/metrics.h"
#include "report/renderer.h"
#include "vmm/guest_image.h"
#include "vmm/kvm.h"
#include "vmm/vmm.h"

namespace exitscope::cli {
namespace {

std::atomic<vmm::Vmm*> g_running_vmm{nullptr};
std::atomic<bool> g_stop_linger{false};

// SIGINT, SIGTERM, SIGHUP: stop the guest; the run then reports and writes its dump as at
// the end (docs/faults.md). After SIGHUP the terminal is gone: writing to it (a pipe to a
// `tee` that the hangup killed) must fail with EPIPE, not end the run by SIGPIPE before the
// dump is written.
extern "C" void OnStopSignal(int signo) {
  if (signo == SIGHUP) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, nullptr);
  }
  if (vmm::Vmm* v = g_running_vmm.load()) v->RequestStop();
  g_stop_linger.store(true);
}

int Usage(const char* self, const std::string& what) {
  return UsageError(self, what);
}

int FailWith(const char* self, const Error& e) {
  return ReportError(self, e);
}

// Whether stdout (the report, and the guest's serial output when no --serial) and the
// --serial file were written whole. Returns 0, or prints one line and returns 1.
// errno is the report's (cleared before it is written): a failed write leaves its error in
// the stream's flag and in errno, and the buffer it could not write is gone.
int CheckOutputsWritten(const char* self, const vmm::VmmResult& r) {
  const int report_err = errno;
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = !flushed && errno != 0 ? errno : report_err;
  if (!flushed || std::ferror(stdout)) {
    std::fprintf(stderr, "%s: standard output: write failed: %s (the report is lost)\n", self,
                 err != 0 ? std::strerror(err) : "write error");
    return 1;
  }
  if (!r.serial_error.empty()) {
    std::fprintf(stderr, "%s: %s\n", self, r.serial_error.c_str());
    return 1;
  }
  return 0;
}

const char* FailureName(uint32_t code) {
  switch (code) {
    case ES_FAIL_GENERIC:
      return "generic failure";
    case ES_FAIL_UART:
      return "UART check failed";
    case ES_FAIL_NVME_INIT:
      return "NVMe controller init failed";
    case ES_FAIL_NVME_IO:
      return "an I/O completed with an error status";
    case ES_FAIL_VERIFY:
      return "data read back differs";
    case ES_FAIL_UNASSIGNED:
      return "unassigned MMIO did not read all ones";
    case ES_FAIL_TIMEOUT:
      return "timed out waiting for the device";
  }
  return "guest-defined failure";
}

int ListGuests() {
  for (const vmm::GuestInfo& g : vmm::ShippedGuests()) {
    auto path = vmm::FindGuestImage(g.name);
    std::printf("%-11s %s\n            %s\n", g.name, g.summary,
                path ? path->c_str() : "(image not built)");
  }
  return 0;
}

void PrintSummary(const vmm::VmmConfig& cfg, const vmm::VmmResult& r) {
  std::fprintf(stderr,
               "exitscope run: guest %s on %u vCPU%s: %s after %.3f s, %llu userspace exits\n",
               cfg.guest.c_str(), cfg.vcpus, cfg.vcpus == 1 ? "" : "s",
               r.fatal     ? "FATAL"
               : r.passed  ? "PASS"
               : r.stopped ? "STOPPED"
                           : "FAIL",
               r.elapsed_s, static_cast<unsigned long long>(r.userspace_exits));
  for (const vmm::VcpuReport& v : r.vcpus) {
    const vmm::VcpuOutcome& o = v.outcome;
    std::string state(vmm::ToString(o.state));
    if (o.state == vmm::VcpuState::kFinished)
      state += o.code == 0 ? " (pass)"
                           : " (code " + std::to_string(o.code) + ": " + FailureName(o.code) + ")";
    std::fprintf(stderr, "  vCPU %u: %s; exits: %llu (io %llu, mmio %llu, hlt %llu, intr %llu)\n",
                 v.vcpu, state.c_str(), static_cast<unsigned long long>(o.exits),
                 static_cast<unsigned long long>(o.io_exits),
                 static_cast<unsigned long long>(o.mmio_exits),
                 static_cast<unsigned long long>(o.hlt_exits),
                 static_cast<unsigned long long>(o.intr_exits));
    if (v.kvm_stats.empty()) continue;
    // KVM's own counters: every exit the kernel saw, most handled there without reaching us.
    // The ones that say what happened come first, each once, zeros included (io_exits stays
    // 0 on kvm-pvm: a 0 is a measurement, not a missing counter); then every other non-zero.
    static constexpr const char* kFirst[] = {
        "exits",          "halt_exits",   "irq_exits",           "insn_emulation",    "mmio_exits",
        "io_exits",       "signal_exits", "irq_window_exits",    "pf_taken",          "pf_fixed",
        "pf_emulate",     "pf_guest",     "fpu_reload",          "host_state_reload", "halt_wakeup",
        "irq_injections", "hypercalls",   "insn_emulation_fail", "request_irq_exits"};
    std::string line;
    auto add = [&](const std::string& k, uint64_t value) {
      std::string item = k + " " + std::to_string(value);
      if (!line.empty() && line.size() + item.size() + 2 > 90) {
        std::fprintf(stderr, "      %s,\n", line.c_str());
        line.clear();
      }
      line += (line.empty() ? "" : ", ") + item;
    };
    std::fprintf(stderr, "    in the kernel (KVM stats):\n");
    for (const char* k : kFirst)
      if (auto it = v.kvm_stats.find(k); it != v.kvm_stats.end()) add(k, it->second);
    for (const auto& [k, value] : v.kvm_stats) {
      if (value == 0 || std::find(std::begin(kFirst), std::end(kFirst), k) != std::end(kFirst))
        continue;
      add(k, value);
    }
    std::fprintf(stderr, "      %s\n", line.c_str());
  }
  if (r.block.submitted > 0 || r.block.errors > 0)
    std::fprintf(stderr,
                 "  nvme0: %llu I/Os submitted, %llu completed, %llu errors, %llu queue-full\n",
                 static_cast<unsigned long long>(r.block.submitted),
                 static_cast<unsigned long long>(r.block.completed),
                 static_cast<unsigned long long>(r.block.errors),
                 static_cast<unsigned long long>(r.block.queue_full));
  if (r.block.backend_waits > 0 || r.block.lock_holds > 0)
    std::fprintf(stderr, "  nvme0 injected: %llu backend delays, %llu lock holds\n",
                 static_cast<unsigned long long>(r.block.backend_waits),
                 static_cast<unsigned long long>(r.block.lock_holds));
  if (!r.kvm_stats_note.empty())
    std::fprintf(stderr, "  in-kernel exit counters unavailable: %s\n", r.kvm_stats_note.c_str());
  if (r.fatal) std::fprintf(stderr, "  fatal: %s\n", r.fatal_detail.c_str());
  if (!r.dump_path.empty()) std::fprintf(stderr, "  dump: %s\n", r.dump_path.c_str());
}

}  // namespace

int RunMain(int argc, char** argv) {
  const char* self = argv[0];
  CLI::App app{
      "Boot a guest on /dev/kvm in the reference VMM, record every userspace exit "
      "and print the exit-health report.",
      "exitscope run"};
  vmm::VmmConfig cfg;
  std::vector<std::string> injects;
  std::string format = "table";
  bool list = false, no_record = false, no_dump = false, no_stacks = false;
  uint64_t disk_mb = 16, mem_mb = ES_DEFAULT_MEM_SIZE >> 20;
  std::string metrics_listen;
  double linger_s = 0;
  app.add_option("--vcpus", cfg.vcpus, "number of vCPUs, one thread each (1..16)")
      ->check(IntegerIn(1, ES_MAX_VCPUS, ""))
      ->default_val(2);
  app.add_option("--guest", cfg.guest, "guest to boot: a name from --list-guests or a path")
      ->default_val("hello");
  app.add_flag("--list-guests", list, "list the shipped guests and exit");
  app.add_option("--guest-arg", cfg.guest_arg,
                 "argument passed to the guest in rdx (iterations, rounds; 0 = its default)")
      ->check(kNonNegativeInteger);
  app.add_option("--serial", cfg.serial_path, "write the UART output to PATH (default: terminal)");
  app.add_option("--disk", cfg.disk_path,
                 "backing file of nvme0, created when missing (default: a temporary file)");
  app.add_option("--disk-size", disk_mb, "size in MiB of a disk created by --disk")
      ->check(kNonNegativeInteger)
      ->default_val(16);
  app.add_option("--mem", mem_mb, "guest memory in MiB")
      ->check(kNonNegativeInteger)
      ->default_val(mem_mb);
  app.add_option("--inject", injects,
                 "fault injection, repeatable: delay:DEVICE[.REGISTER]:MS[:EVERY_N] (the vCPU "
                 "sleeps in the exit), spin:DEVICE[.REGISTER]:MS[:EVERY_N] (it busy-waits), "
                 "backend-delay:DEVICE:MS[:EVERY_N] (the doorbell waits MS "
                 "for the backend), backend-error:DEVICE:EVERY_N, lock:DEVICE:MS:EVERY_N "
                 "(another thread holds the device's lock MS before every Nth I/O); MS "
                 "1..3600000, EVERY_N >= 1 (docs/vmm.md)");
  app.add_option("--slow", cfg.slow_ms,
                 "slow-exit threshold in ms, 1..3600000 (also the watchdog's stuck-vCPU threshold)")
      ->check(IntegerIn(1, 3'600'000, "ms"))
      ->default_val(20);
  app.add_option("--io-age", cfg.io_age_ms,
                 "watchdog: report I/Os in flight this long (ms, 1..86400000)")
      ->check(IntegerIn(1, 86'400'000, "ms"))
      ->default_val(20000);
  app.add_option("--backend-depth", cfg.backend_depth,
                 "I/Os nvme0's backend holds (queued or in service) before a doorbell waits "
                 "inside its exit; 1 = synchronous submission")
      ->check(kNonNegativeInteger)
      ->default_val(1);
  app.add_option("--dump", cfg.dump_path,
                 "dump file written at the end and on a fatal guest error "
                 "(default: exitscope-<pid>.esdump)");
  app.add_flag("--no-dump", no_dump, "do not write a dump at the end");
  app.add_option("--duration", cfg.duration_s,
                 "stop the guest after SECONDS, 0..31536000 (default: when it ends)")
      ->check(NumberIn(0, 31'536'000, "s"));
  app.add_flag("--no-record", no_record, "run without the recorder (for overhead comparisons)");
  app.add_flag("--no-stacks", no_stacks,
               "no stack captures of stuck vCPU threads (default: the watchdog captures them, "
               "user stacks through signal SIGRTMIN+2)");
  app.add_option("--format", format,
                 "the end-of-run report's format: " + report::FormatChoices(report::Need::kFile))
      ->default_val("table");
  std::string output;
  app.add_option("-o,--output", output,
                 "write the end-of-run report to FILE ('-' or none: stdout); --format html and "
                 "timeline need it");
  app.add_option("--metrics", metrics_listen,
                 "serve Prometheus metrics on http://ADDR:PORT/metrics while the guest runs "
                 "(:PORT = 127.0.0.1:PORT; docs/prometheus.md)");
  app.add_option("--linger", linger_s,
                 "with --metrics: keep serving SECONDS after the guest stopped, so the last "
                 "values get scraped (Ctrl-C ends it; 0..86400)")
      ->check(NumberIn(0, 86'400, "s"));
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  if (list) return ListGuests();
  int status = 0;
  const report::Renderer* renderer =
      PickRenderer(self, format, report::Need::kFile, output, &status);
  if (renderer == nullptr) return status;
  if (cfg.vcpus == 0 || cfg.vcpus > ES_MAX_VCPUS)
    return Usage(self, "--vcpus " + std::to_string(cfg.vcpus) + ": out of range (1..16)");
  if (cfg.duration_s < 0) return Usage(self, "--duration: must not be negative");
  if (cfg.slow_ms == 0) return Usage(self, "--slow: must be at least 1 ms");
  if (disk_mb == 0 || disk_mb > (1 << 20)) return Usage(self, "--disk-size: out of range");
  if (mem_mb < 16 || mem_mb > 65536) return Usage(self, "--mem: out of range (16..65536 MiB)");
  MetricsOptions mopts;
  if (!metrics_listen.empty()) {
    if (no_record) return Usage(self, "--metrics: needs the recorder (drop --no-record)");
    auto listen = ParseMetricsListen(metrics_listen);
    if (!listen) return Usage(self, "--" + listen.error().message);
    mopts.listen = *listen;
  } else if (linger_s > 0) {
    return Usage(self, "--linger: only with --metrics");
  }
  for (const std::string& s : injects) {
    auto spec = vmm::ParseInjectSpec(s);
    if (!spec) return Usage(self, spec.error().message);
    cfg.injects.push_back(std::move(*spec));
  }
  if (auto image = vmm::FindGuestImage(cfg.guest); !image) return FailWith(self, image.error());
  cfg.disk_bytes = disk_mb << 20;
  cfg.mem_bytes = mem_mb << 20;
  cfg.record = !no_record;
  cfg.write_dump = !no_dump;
  // A report on stdout that is not the table: the guest's serial output goes to stderr.
  if (format != "table" && (output.empty() || output == "-") && cfg.serial_path.empty())
    cfg.serial_stream = stderr;

  // Without KVM nothing else matters: say so before creating disks or dumps.
  if (auto kvm = vmm::KvmSystem::Open(cfg.kvm_path); !kvm) {
    std::fprintf(stderr, "%s: %s: this command needs KVM\n", self, kvm.error().message.c_str());
    return 1;
  }
  auto vm = vmm::Vmm::Create(cfg);
  if (!vm) return FailWith(self, vm.error());
  if (Recorder* rec = (*vm)->recorder()) {
    // Stack captures of stuck vCPU threads (docs/vmm.md): the watchdog signals a stuck thread
    // with SIGRTMIN+2 and the thread unwinds itself. Without the signal, captures keep the
    // thread's state and kernel stack only.
    if (no_stacks) {
      rec->SetStackCapture(false);
    } else if (Status s = rec->InstallStackSignal(SIGRTMIN + 2); !s) {
      std::fprintf(stderr, "%s: stack captures without user stacks: %s\n", self,
                   s.error().message.c_str());
    }
  }
  std::unique_ptr<MetricsExporter> metrics;  // destroyed before the Vmm and its recorder
  if (!metrics_listen.empty()) {
    auto m = MetricsExporter::Start(*(*vm)->recorder(), mopts);
    if (!m) return FailWith(self, Error{m.error().code, "--" + m.error().message});  // --metrics
    metrics = std::move(*m);
    std::fprintf(stderr, "exitscope run: metrics on http://%s/metrics\n",
                 metrics->address().c_str());
  }
  g_running_vmm.store(vm->get());
  struct sigaction sa {
  }, old_int{}, old_term{}, old_hup{};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  // Under nohup SIGHUP comes ignored: it stays so, and the run goes on.
  sigaction(SIGHUP, nullptr, &old_hup);
  if (old_hup.sa_handler != SIG_IGN) sigaction(SIGHUP, &sa, nullptr);
  auto result = (*vm)->Run();
  if (metrics) {
    metrics->Collect();
    // Up to the deadline, not by counting sleeps: a signal cuts a usleep short.
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::microseconds(static_cast<int64_t>(linger_s * 1e6));
    while (!g_stop_linger.load() && std::chrono::steady_clock::now() < until) ::usleep(100'000);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  g_running_vmm.store(nullptr);
  if (!result) {
    std::fprintf(stderr, "%s: %s\n", self, result.error().message.c_str());
    return 1;
  }
  PrintSummary(cfg, *result);
  errno = 0;  // CheckOutputsWritten names the report's write error
  if (Recorder* rec = (*vm)->recorder()) {
    const Dump snapshot = rec->Snapshot();
    report::HealthModel h{.dump = &snapshot};
    h.options.source = "live snapshot of exitscope run --guest " + cfg.guest;
    if (!cfg.dump_path.empty())
      h.options.events_command = "exitscope inspect " + cfg.dump_path + " --events";
    report::ReportModel m{.health = &h};
    m.timeline.dump = &snapshot;
    if (Status s = report::WriteReport(*renderer, m, output); !s) {
      std::fprintf(stderr, "%s: %s (the report is lost)\n", self, s.error().message.c_str());
      return 1;
    }
  }
  // A report (or serial output) that could not be written is lost: never exit 0 (issue 28).
  if (int rc = CheckOutputsWritten(self, *result); rc != 0) return rc;
  if (result->fatal) return 1;
  if (!result->dump_error.empty()) return 1;  // the evidence is lost: never exit 0 (logged above)
  if (result->stopped) {
    for (const vmm::VcpuReport& v : result->vcpus)
      if (v.outcome.state == vmm::VcpuState::kFinished && v.outcome.code != 0) return 1;
    return 0;
  }
  return result->passed ? 0 : 1;
}

}  // namespace exitscope::cli
