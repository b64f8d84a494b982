// html_report_scale: the HTML report of a big dump (docs/html-report.md, "1 M exits").
//
//   build/bench/html_report_scale [--exits N] [--vcpus N] [--dump PATH] [--html PATH]
//
// Makes a synthetic dump with the recorder library: --vcpus vCPUs (default 8) share --exits
// exits (default 1048576, rings sized to hold all of them), MMIO on four NVMe controllers'
// registers and PIO on a UART, with a slow-exit threshold of 20 us; every 1009th exit spins
// 25 us inside the exit (so about 0.1% are slow), every 101st 3 us. The durations are the
// real ones of this host's clock. The dump is written to --dump, read back with ReadDump, and
// rendered as the `inspect --format html` page (report::RenderExitHealthHtml) to --html. It
// prints the dump's size, the time to read it, the time to render the page (median of 3) and
// the page's size. Exit status 1 when the plotting library is not in this build.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/output_file.h"
#include "exitscope/dump.h"
#include "exitscope/recorder.h"
#include "report/html_report.h"

using namespace exitscope;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Spin(double seconds) {
  const double end = Now() + seconds;
  while (Now() < end) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t exits = 1 << 20;
  uint32_t vcpus = 8;
  std::string dump_path = "/tmp/exitscope-html-1m.esdump", html_path = "/tmp/exitscope-1m.html";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--exits" && has)
      exits = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--vcpus" && has)
      vcpus = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    else if (a == "--dump" && has)
      dump_path = argv[++i];
    else if (a == "--html" && has)
      html_path = argv[++i];
    else {
      std::fprintf(
          stderr, "usage: html_report_scale [--exits N] [--vcpus N] [--dump PATH] [--html PATH]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (!report::HtmlUnavailable().empty()) {
    std::fprintf(stderr, "html_report_scale: %s\n", report::HtmlUnavailable().data());
    return 1;
  }
  if (vcpus == 0 || exits < vcpus) {
    std::fprintf(stderr, "html_report_scale: --vcpus must be 1..--exits\n");
    return 2;
  }

  RecorderOptions ro;
  ro.num_vcpus = vcpus;
  ro.events_per_vcpu = std::bit_ceil((exits + vcpus - 1) / vcpus);
  ro.slow_exit.threshold_ns = 20'000;
  ro.slow_exit.log = false;
  ro.findings = 65536;
  ro.start_watchdog = false;
  auto created = Recorder::Create(ro);
  if (!created) {
    std::fprintf(stderr, "html_report_scale: %s\n", created.error().message.c_str());
    return 1;
  }
  Recorder& rec = **created;
  constexpr uint64_t kBase = 0xfe000000, kBar = 0x4000;
  constexpr uint16_t kUart = 0x3f8;
  const auto nvme = *RegisterMap::Builtin("nvme");
  for (int i = 0; i < 4; ++i) {
    const uint32_t d =
        *rec.address_space().AddDevice({.name = "nvme" + std::to_string(i), .kind = "nvme"});
    (void)rec.address_space().AddRange(IoSpace::kMmio, kBase + kBar * i, kBar, d, nvme);
  }
  const uint32_t uart = *rec.address_space().AddDevice({.name = "uart0", .kind = "uart16550"});
  (void)rec.address_space().AddRange(IoSpace::kPio, kUart, 8, uart,
                                     *RegisterMap::Builtin("uart16550"));

  static const uint64_t kOffsets[] = {0x1000, 0x1008, 0x1010, 0x1004, 0x100c, 0x1c, 0x14};
  const double t0 = Now();
  for (uint64_t i = 0; i < exits; ++i) {
    const uint32_t v = static_cast<uint32_t>(i % vcpus);
    if (i % 8 == 7) {
      rec.BeginExit(v, ExitKind::kPio, kUart + (i / 8) % 6, 1,
                    (i / 8) % 2 ? AccessDir::kRead : AccessDir::kWrite);
    } else {
      rec.BeginExit(v, ExitKind::kMmio, kBase + kBar * ((i / 3) % 4) + kOffsets[(i / 5) % 7], 4,
                    AccessDir::kWrite);
    }
    if (i % 1009 == 1008)
      Spin(25e-6);
    else if (i % 101 == 100)
      Spin(3e-6);
    rec.EndExit(v);
  }
  const double t_record = Now() - t0;
  if (Status s = rec.WriteDump(dump_path); !s) {
    std::fprintf(stderr, "html_report_scale: %s\n", s.error().message.c_str());
    return 1;
  }
  double t = Now();
  auto dump = ReadDump(dump_path);
  const double t_read = Now() - t;
  if (!dump) {
    std::fprintf(stderr, "html_report_scale: %s\n", dump.error().message.c_str());
    return 1;
  }
  uint64_t in_dump = 0;
  for (const DumpVcpu& v : dump->vcpus) in_dump += v.exits.size();
  std::FILE* f = std::fopen(dump_path.c_str(), "rb");
  std::fseek(f, 0, SEEK_END);
  const long dump_bytes = std::ftell(f);
  std::fclose(f);

  report::ExitHealthOptions o;
  o.source = dump_path;
  std::vector<double> times;
  std::string html;
  for (int round = 0; round < 3; ++round) {
    t = Now();
    html = report::RenderExitHealthHtml(*dump, o);
    times.push_back(Now() - t);
  }
  std::sort(times.begin(), times.end());
  if (Status s = base::WriteOutputFile(html_path, html); !s) {
    std::fprintf(stderr, "html_report_scale: %s\n", s.error().message.c_str());
    return 1;
  }
  std::printf("recorded %llu exits on %u vCPUs in %.2f s; dump %s: %llu exits, %ld bytes\n",
              static_cast<unsigned long long>(exits), vcpus, t_record, dump_path.c_str(),
              static_cast<unsigned long long>(in_dump), dump_bytes);
  std::printf("ReadDump: %.0f ms\n", t_read * 1e3);
  std::printf("html %llu exits: %.0f ms (median of 3: %.0f / %.0f / %.0f), %zu bytes -> %s\n",
              static_cast<unsigned long long>(in_dump), times[1] * 1e3, times[0] * 1e3,
              times[1] * 1e3, times[2] * 1e3, html.size(), html_path.c_str());
  return 0;
}
