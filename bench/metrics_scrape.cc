// The scrape cost of the Prometheus endpoint, measured in one run: a Recorder with V vCPUs whose
// exits touch R registers of nvme0 each (V x R exit-duration histograms), folded by the
// exporter's collector, then
//   - the time to render /metrics in-process (MetricsExporter::Render, what a scrape serialises),
//   - the time of a full HTTP GET /metrics through prometheus-cpp's civetweb listener,
//   - the bytes of the page and the time series it holds,
//   - the collector's cost per exit record folded.
// Medians of --repeat runs; one line each.
//
//   build/bench/metrics_scrape [--vcpus 64] [--registers 20] [--exits 50] [--repeat 20]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "exitscope/metrics.h"
#include "exitscope/recorder.h"
#include "metrics_text.h"

using namespace exitscope;
using Steady = std::chrono::steady_clock;

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// CPU time of this thread: the render's own cost, whatever else the machine runs.
double ThreadCpuMs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

double Ms(Steady::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t vcpus = 64, registers = 20, exits = 50, repeat = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const unsigned long v = std::strtoul(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--vcpus"))
      vcpus = static_cast<uint32_t>(v);
    else if (!std::strcmp(argv[i], "--registers"))
      registers = static_cast<uint32_t>(v);
    else if (!std::strcmp(argv[i], "--exits"))
      exits = static_cast<uint32_t>(v);
    else if (!std::strcmp(argv[i], "--repeat"))
      repeat = static_cast<uint32_t>(v);
    else {
      std::fprintf(stderr, "metrics_scrape: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (vcpus == 0 || registers == 0 || registers > 4096 || exits == 0 || repeat == 0) {
    std::fprintf(stderr, "metrics_scrape: every count must be >= 1 (registers <= 4096)\n");
    return 2;
  }
  RecorderOptions ro;
  ro.num_vcpus = vcpus;
  ro.events_per_vcpu = uint64_t{registers} * exits;  // one pass fits a ring
  ro.start_watchdog = false;
  ro.slow_exit.log = false;  // a preempted exit is not news here
  auto rec = Recorder::Create(ro);
  if (!rec) {
    std::fprintf(stderr, "metrics_scrape: %s\n", rec.error().message.c_str());
    return 1;
  }
  Recorder& r = **rec;
  const uint32_t nvme = *r.address_space().AddDevice({.name = "nvme0", .kind = "nvme"});
  (void)r.address_space().AddRange(IoSpace::kMmio, 0xfebf0000, 0x4000, nvme,
                                   *RegisterMap::Builtin("nvme"));
  MetricsOptions mo;
  mo.listen = "127.0.0.1:0";
  mo.collect_interval_ms = 60000;  // collected explicitly below
  mo.max_registers_per_device = std::max<uint32_t>(registers, 64);
  auto exp = MetricsExporter::Start(r, mo);
  if (!exp) {
    std::fprintf(stderr, "metrics_scrape: %s\n", exp.error().message.c_str());
    return 1;
  }
  MetricsExporter& e = **exp;

  // Doorbells SQ0TDBL, CQ0HDBL, SQ1TDBL, ... : 4-byte registers 4 bytes apart from 0x1000.
  uint64_t records = 0;
  auto record_all = [&] {
    for (uint32_t v = 0; v < vcpus; ++v) {
      for (uint32_t x = 0; x < exits; ++x) {
        for (uint32_t g = 0; g < registers; ++g) {
          r.BeginExit(v, ExitKind::kMmio, 0xfebf1000 + 4ull * g, 4, AccessDir::kWrite, x);
          r.EndExit(v);
          ++records;
        }
      }
    }
  };
  // First pass: creates every series. Second: the same exits again, series known (steady state).
  record_all();
  auto c0 = Steady::now();
  e.Collect();
  const double first_ms = Ms(Steady::now() - c0);
  const uint64_t per_pass = records;
  record_all();
  c0 = Steady::now();
  e.Collect();
  const double steady_ms = Ms(Steady::now() - c0);
  const MetricsCounters mc = e.counters();

  std::vector<double> render_ms, render_cpu_ms, get_ms;
  size_t bytes = 0, http_bytes = 0;
  for (uint32_t i = 0; i < repeat; ++i) {
    const auto t0 = Steady::now();
    const double cpu0 = ThreadCpuMs();
    const std::string page = e.Render();
    render_cpu_ms.push_back(ThreadCpuMs() - cpu0);
    render_ms.push_back(Ms(Steady::now() - t0));
    bytes = page.size();
    const auto t1 = Steady::now();
    auto body = testing::HttpGet("127.0.0.1", e.port(), "/metrics");
    get_ms.push_back(Ms(Steady::now() - t1));
    if (!body) {
      std::fprintf(stderr, "metrics_scrape: GET /metrics failed\n");
      return 1;
    }
    http_bytes = body->size();
  }
  std::string err;
  const size_t samples = testing::ParseExposition(e.Render(), &err).size();
  std::printf("metrics_scrape: %u vCPUs x %u registers (%u exits each, %llu records)\n", vcpus,
              registers, exits, static_cast<unsigned long long>(records));
  std::printf("  exit-duration histograms  %u\n", vcpus * registers);
  std::printf("  time series               %zu (exporter counts %llu)\n", samples,
              static_cast<unsigned long long>(mc.series));
  std::printf("  /metrics bytes            %zu (HTTP body %zu)\n", bytes, http_bytes);
  std::printf("  render /metrics           %.2f ms wall, %.2f ms CPU, median of %u\n",
              Median(render_ms), Median(render_cpu_ms), repeat);
  std::printf("  HTTP GET /metrics         %.2f ms median of %u\n", Median(get_ms), repeat);
  std::printf("  collect, new series       %.2f ms for %llu records (%.0f ns each)\n", first_ms,
              static_cast<unsigned long long>(per_pass),
              first_ms * 1e6 / static_cast<double>(per_pass));
  std::printf("  collect, steady state     %.2f ms for %llu records (%.0f ns each)\n", steady_ms,
              static_cast<unsigned long long>(per_pass),
              steady_ms * 1e6 / static_cast<double>(per_pass));
  std::printf("  folded %llu, missed %llu\n", static_cast<unsigned long long>(mc.exits_folded),
              static_cast<unsigned long long>(mc.exits_missed));
  return 0;
}
