// The Prometheus endpoint of a Recorder: /metrics fetched over HTTP on an ephemeral loopback
// port and parsed; counts equal the exits recorded, buckets are cumulative, labels are the
// devices and registers of the accesses, unassigned addresses collapse into one series, the
// register label is bounded, and records the exporter could not read are counted.
#include "exitscope/metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include "exitscope/exitscope.h"
#include "exitscope/recorder.h"
#include "metrics_text.h"

namespace exitscope {
namespace {

using testing::HttpGet;
using testing::ParseExposition;
using testing::Sample;
using testing::Select;

constexpr uint64_t kNvme = 0xfebf0000;
constexpr uint64_t kSq1Tdbl = kNvme + 0x1008;  // SQ1TDBL
constexpr uint64_t kCc = kNvme + 0x14;

struct Vm {
  std::unique_ptr<Recorder> rec;
  uint32_t nvme = 0, uart = 0;
};

Vm MakeVm(RecorderOptions o = {}) {
  if (o.num_vcpus == 1) o.num_vcpus = 2;
  o.start_watchdog = false;
  o.slow_exit.log = false;
  auto r = Recorder::Create(o);
  EXPECT_TRUE(r) << r.error().message;
  Vm vm{std::move(*r)};
  AddressSpace& as = vm.rec->address_space();
  vm.nvme = *as.AddDevice({.name = "nvme0", .kind = "nvme"});
  vm.uart = *as.AddDevice({.name = "uart0", .kind = "uart16550"});
  EXPECT_TRUE(as.AddRange(IoSpace::kMmio, kNvme, 0x4000, vm.nvme, *RegisterMap::Builtin("nvme")));
  EXPECT_TRUE(as.AddRange(IoSpace::kPio, 0x3f8, 8, vm.uart, *RegisterMap::Builtin("uart16550")));
  return vm;
}

void Exit(Recorder& r, uint32_t vcpu, ExitKind kind, uint64_t addr = 0, uint8_t size = 0,
          AccessDir dir = AccessDir::kNone) {
  r.BeginExit(vcpu, kind, addr, size, dir, 1);
  r.EndExit(vcpu);
}

std::vector<Sample> Scrape(const MetricsExporter& e) {
  int status = 0;
  auto body = HttpGet("127.0.0.1", e.port(), "/metrics", &status);
  EXPECT_TRUE(body) << "GET /metrics on " << e.address() << ": status " << status;
  if (!body) return {};
  std::string err;
  auto samples = ParseExposition(*body, &err);
  EXPECT_TRUE(err.empty()) << err;
  return samples;
}

double Value(const std::vector<Sample>& all, std::string_view name,
             const std::map<std::string, std::string>& labels) {
  auto s = Select(all, name, labels);
  EXPECT_EQ(s.size(), 1u) << name << " with the given labels";
  return s.empty() ? -1 : s.front().value;
}

MetricsOptions Ephemeral() {
  MetricsOptions o;
  o.listen = "127.0.0.1:0";
  o.vm = "vm1";
  o.collect_interval_ms = 60000;  // the tests collect explicitly
  return o;
}

TEST(MetricsExporter, CountsLabelsAndCumulativeBuckets) {
  Vm vm = MakeVm();
  Recorder& r = *vm.rec;
  for (int i = 0; i < 10; ++i) Exit(r, 0, ExitKind::kMmio, kSq1Tdbl, 4, AccessDir::kWrite);
  for (int i = 0; i < 5; ++i) Exit(r, 1, ExitKind::kPio, 0x3f8, 1, AccessDir::kWrite);
  // Three addresses no device covers: one series, device="unassigned".
  for (uint64_t a : {0x10000000ull, 0x20000000ull, 0x30000004ull})
    Exit(r, 1, ExitKind::kMmio, a, 4, AccessDir::kRead);
  Exit(r, 0, ExitKind::kHlt);
  Exit(r, 1, ExitKind::kHlt);

  auto e = MetricsExporter::Start(r, Ephemeral());
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_NE((*e)->port(), 0);
  EXPECT_EQ((*e)->address(), "127.0.0.1:" + std::to_string((*e)->port()));
  const std::vector<Sample> all = Scrape(**e);
  ASSERT_FALSE(all.empty());

  const std::string h = "exitscope_exit_duration_seconds";
  EXPECT_EQ(Value(all, h + "_count",
                  {{"vm", "vm1"},
                   {"vcpu", "0"},
                   {"kind", "MMIO"},
                   {"device", "nvme0"},
                   {"register", "SQ1TDBL"}}),
            10);
  EXPECT_EQ(Value(all, h + "_count",
                  {{"vcpu", "1"}, {"kind", "PIO"}, {"device", "uart0"}, {"register", "THR"}}),
            5);
  auto unassigned = Select(all, h + "_count", {{"device", "unassigned"}});
  ASSERT_EQ(unassigned.size(), 1u);
  EXPECT_EQ(unassigned[0].value, 3);
  EXPECT_EQ(unassigned[0].labels.at("register"), "");
  EXPECT_EQ(unassigned[0].labels.at("kind"), "MMIO");
  // HLT has no device or register: empty labels (which Prometheus stores as absent).
  auto hlt = Select(all, h + "_count", {{"vcpu", "0"}, {"kind", "HLT"}});
  ASSERT_EQ(hlt.size(), 1u);
  EXPECT_EQ(hlt[0].value, 1);
  EXPECT_EQ(hlt[0].labels["device"], "");
  EXPECT_EQ(hlt[0].labels["register"], "");

  double total = 0;
  for (const Sample& s : Select(all, h + "_count")) total += s.value;
  EXPECT_EQ(total, 20);

  // Buckets: the documented bounds, cumulative, +Inf == _count.
  const std::vector<double> bounds = MetricsDurationBuckets();
  ASSERT_EQ(bounds.size(), 28u);
  EXPECT_DOUBLE_EQ(bounds.front(), 100e-9);
  EXPECT_DOUBLE_EQ(bounds.back(), 100.0);
  for (const Sample& count : Select(all, h + "_count")) {
    std::map<std::string, std::string> labels = count.labels;
    std::vector<Sample> buckets = Select(all, h + "_bucket", labels);
    ASSERT_EQ(buckets.size(), bounds.size() + 1);
    double prev = 0;
    for (size_t i = 0; i < buckets.size(); ++i) {
      const std::string& le = buckets[i].labels.at("le");
      if (i < bounds.size()) {
        EXPECT_NEAR(std::stod(le), bounds[i], bounds[i] * 1e-9) << le;
      } else {
        EXPECT_EQ(le, "+Inf");
      }
      EXPECT_GE(buckets[i].value, prev) << "bucket le=" << le << " not cumulative";
      prev = buckets[i].value;
    }
    EXPECT_EQ(prev, count.value);
  }
  EXPECT_EQ((*e)->counters().exits_folded, 20u);
  EXPECT_EQ((*e)->counters().exits_missed, 0u);
  EXPECT_EQ(Value(all, "exitscope_lost_records_total",
                  {{"source", "exits"}, {"reason", "exporter_missed"}}),
            0);
}

TEST(MetricsExporter, NewExitsAppearAfterCollectionAndSlowOnesAreCounted) {
  Vm vm = MakeVm();
  Recorder& r = *vm.rec;
  r.SetSlowExitPolicy({.threshold_ns = 20'000'000, .log = false});
  auto e = MetricsExporter::Start(r, Ephemeral());
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_TRUE(Select(Scrape(**e), "exitscope_exit_duration_seconds_count").empty());

  Exit(r, 0, ExitKind::kMmio, kCc, 4, AccessDir::kWrite);
  r.BeginExit(0, ExitKind::kMmio, kCc, 4, AccessDir::kWrite, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // >= the 20 ms threshold
  r.EndExit(0);
  (*e)->Collect();
  const auto all = Scrape(**e);
  const std::map<std::string, std::string> cc{
      {"vcpu", "0"}, {"device", "nvme0"}, {"register", "CC"}};
  EXPECT_EQ(Value(all, "exitscope_exit_duration_seconds_count", cc), 2);
  EXPECT_EQ(Value(all, "exitscope_slow_exits_total", cc), 1);
  // The slow one took at least 30 ms: in no bucket up to 25 ms, in the 50 ms one.
  auto at = [&](const char* le) {
    auto l = cc;
    l["le"] = le;
    return Value(all, "exitscope_exit_duration_seconds_bucket", l);
  };
  EXPECT_EQ(at("0.025"), at("0.01"));
  EXPECT_EQ(at("0.05") - at("0.025"), 1);
  EXPECT_GE(Value(all, "exitscope_exit_duration_seconds_sum", cc), 0.030);
}

TEST(MetricsExporter, RecordsOverwrittenBeforeCollectionAreCountedAsMissed) {
  Vm vm = MakeVm({.num_vcpus = 2, .events_per_vcpu = 16});
  Recorder& r = *vm.rec;
  auto e = MetricsExporter::Start(r, Ephemeral());
  ASSERT_TRUE(e) << e.error().message;
  for (int i = 0; i < 100; ++i) Exit(r, 0, ExitKind::kMmio, kSq1Tdbl, 4, AccessDir::kWrite);
  (*e)->Collect();
  EXPECT_EQ((*e)->counters().exits_folded, 16u);
  EXPECT_EQ((*e)->counters().exits_missed, 84u);
  const auto all = Scrape(**e);
  EXPECT_EQ(Value(all, "exitscope_exit_duration_seconds_count", {{"register", "SQ1TDBL"}}), 16);
  EXPECT_EQ(Value(all, "exitscope_lost_records_total",
                  {{"source", "exits"}, {"reason", "exporter_missed"}}),
            84);
  EXPECT_EQ(Value(all, "exitscope_lost_records_total",
                  {{"source", "exits"}, {"reason", "ring_overwritten"}}),
            84);
  // Folded once: a second pass adds nothing.
  (*e)->Collect();
  EXPECT_EQ(Value(Scrape(**e), "exitscope_exit_duration_seconds_count", {{"register", "SQ1TDBL"}}),
            16);
}

TEST(MetricsExporter, RegisterLabelIsBoundedPerDevice) {
  Vm vm = MakeVm();
  Recorder& r = *vm.rec;
  for (uint64_t q = 0; q < 6; ++q)
    Exit(r, 0, ExitKind::kMmio, kNvme + 0x1000 + 8 * q, 4, AccessDir::kWrite);
  MetricsOptions o = Ephemeral();
  o.max_registers_per_device = 4;
  auto e = MetricsExporter::Start(r, o);
  ASSERT_TRUE(e) << e.error().message;
  const auto counts =
      Select(Scrape(**e), "exitscope_exit_duration_seconds_count", {{"device", "nvme0"}});
  std::set<std::string> regs;
  double other = 0;
  for (const Sample& s : counts) {
    regs.insert(s.labels.at("register"));
    if (s.labels.at("register") == "other") other = s.value;
  }
  EXPECT_EQ(regs, (std::set<std::string>{"SQ0TDBL", "SQ1TDBL", "SQ2TDBL", "SQ3TDBL", "other"}));
  EXPECT_EQ(other, 2);
}

TEST(MetricsExporter, DeviceIoLatencyAndInFlight) {
  Vm vm = MakeVm();
  Recorder& r = *vm.rec;
  auto e = MetricsExporter::Start(r, Ephemeral());
  ASSERT_TRUE(e) << e.error().message;
  r.IoSubmit(vm.nvme, 1);
  r.IoSubmit(vm.nvme, 2);
  r.IoComplete(vm.nvme, 1);
  (*e)->Collect();
  const auto all = Scrape(**e);
  EXPECT_EQ(Value(all, "exitscope_io_latency_seconds_count", {{"device", "nvme0"}}), 1);
  EXPECT_EQ(Value(all, "exitscope_io_in_flight", {{"device", "nvme0"}}), 1);
  EXPECT_GT(Value(all, "exitscope_io_oldest_in_flight_seconds", {{"device", "nvme0"}}), 0);
  EXPECT_EQ(Value(all, "exitscope_io_in_flight", {{"device", "uart0"}}), 0);
  r.IoComplete(vm.nvme, 2);
  (*e)->Collect();
  const auto after = Scrape(**e);
  EXPECT_EQ(Value(after, "exitscope_io_latency_seconds_count", {{"device", "nvme0"}}), 2);
  EXPECT_EQ(Value(after, "exitscope_io_in_flight", {{"device", "nvme0"}}), 0);
  EXPECT_EQ((*e)->counters().device_events_folded, 4u);
}

TEST(MetricsExporter, StuckVcpuIsCounted) {
  Vm vm = MakeVm();
  Recorder& r = *vm.rec;
  ASSERT_TRUE(r.StartWatchdog({.stuck_exit_ns = 20'000'000, .poll_ns = 2'000'000}));
  r.SetLogSink([](std::string_view) {});
  auto e = MetricsExporter::Start(r, Ephemeral());
  ASSERT_TRUE(e) << e.error().message;
  r.BeginExit(1, ExitKind::kMmio, kSq1Tdbl, 4, AccessDir::kWrite, 1);
  auto stuck_found = [&] {
    for (const FindingRecord& f : r.Findings())
      if (f.type == FindingType::kStuckExitBegin) return true;
    return false;
  };
  for (int i = 0; i < 500 && !stuck_found(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(stuck_found()) << "the watchdog reported no stuck exit in 5 s";
  (*e)->Collect();
  auto all = Scrape(**e);
  EXPECT_EQ(Value(all, "exitscope_stuck_vcpu_total", {{"vcpu", "1"}}), 1);
  EXPECT_GT(Value(all, "exitscope_vcpu_exit_in_progress_seconds", {{"vcpu", "1"}}), 0.02);
  EXPECT_EQ(Value(all, "exitscope_vcpu_exit_in_progress_seconds", {{"vcpu", "0"}}), 0);
  r.EndExit(1);
  r.StopWatchdog();
}

TEST(MetricsExporter, ListenAddresses) {
  EXPECT_EQ(*ParseMetricsListen(":9464"), "127.0.0.1:9464");
  EXPECT_EQ(*ParseMetricsListen("localhost:9464"), "127.0.0.1:9464");
  EXPECT_EQ(*ParseMetricsListen("0.0.0.0:9464"), "0.0.0.0:9464");
  EXPECT_EQ(*ParseMetricsListen("127.0.0.1:0"), "127.0.0.1:0");
  for (const char* bad : {"9464", "host:9464", "127.0.0.1:", "127.0.0.1:65536", ":-1", ":9x"}) {
    auto r = ParseMetricsListen(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find(bad), std::string::npos) << r.error().message;
  }
  // The default is loopback.
  EXPECT_EQ(MetricsOptions{}.listen.rfind("127.0.0.1:", 0), 0u);
}

TEST(MetricsExporter, AddressInUseIsAnIoError) {
  Vm vm = MakeVm();
  auto first = MetricsExporter::Start(*vm.rec, Ephemeral());
  ASSERT_TRUE(first) << first.error().message;
  MetricsOptions o = Ephemeral();
  o.listen = (*first)->address();
  auto second = MetricsExporter::Start(*vm.rec, o);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, ErrorCode::kIo);
  // Issue 28 item 8: it said "null context when constructing CivetServer" (civetweb's words).
  EXPECT_EQ(second.error().message, "metrics " + (*first)->address() + ": port in use");
}

// Issue 28 item 8: civetweb matches a handler's URI as a prefix, so "/metricsX" answered 200
// with the metrics. Only "/metrics" (with or without a query) is served; the rest is 404.
TEST(MetricsExporter, OnlyTheMetricsPathIsServed) {
  Vm vm = MakeVm();
  auto e = MetricsExporter::Start(*vm.rec, Ephemeral());
  ASSERT_TRUE(e) << e.error().message;
  int status = 0;
  EXPECT_TRUE(HttpGet("127.0.0.1", (*e)->port(), "/metrics", &status));
  EXPECT_EQ(status, 200);
  EXPECT_TRUE(HttpGet("127.0.0.1", (*e)->port(), "/metrics?x=1", &status));
  EXPECT_EQ(status, 200);
  for (const char* path : {"/metricsX", "/metrics/x", "/metrics.txt", "/", "/x"}) {
    SCOPED_TRACE(path);
    status = 0;
    EXPECT_FALSE(HttpGet("127.0.0.1", (*e)->port(), path, &status));
    EXPECT_EQ(status, 404);
  }
}

// A loopback connection to `port` (connected, nothing sent), or -1.
int Connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Issue 28: two idle connections stopped /metrics for 30 s (civetweb's 2 workers, each
// waiting 30 s for a request), and 200 clients sending partial headers slowly made every
// scrape time out. Now 200 idle connections and 20 slow ones are held open while a scrape is
// made: it must answer (HttpGet gives up after 10 s without a byte). No timing is asserted
// beyond that.
TEST(MetricsExporter, ScrapesWhileIdleAndSlowClientsHoldConnections) {
  Vm vm = MakeVm();
  Exit(*vm.rec, 0, ExitKind::kMmio, kSq1Tdbl, 4, AccessDir::kWrite);
  auto e = MetricsExporter::Start(*vm.rec, Ephemeral());
  ASSERT_TRUE(e) << e.error().message;
  const uint16_t port = (*e)->port();
  std::vector<int> idle, slow;
  for (int i = 0; i < 200; ++i) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0) << "idle connection " << i;
    idle.push_back(fd);
  }
  constexpr std::string_view kPartial = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (int i = 0; i < 20; ++i) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0) << "slow connection " << i;
    ASSERT_EQ(::send(fd, kPartial.data(), kPartial.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(kPartial.size()));
    slow.push_back(fd);
  }
  // The slow clients send one more header byte every 100 ms (a slowloris) until the scrape
  // is over, for 60 s at most.
  std::atomic<bool> scraped{false};
  std::thread trickle([&] {
    for (int tick = 0; tick < 600 && !scraped.load(); ++tick) {
      for (const int fd : slow) (void)::send(fd, "X", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  auto body = HttpGet("127.0.0.1", port, "/metrics", &status);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  scraped.store(true);
  trickle.join();
  for (const int fd : idle) ::close(fd);
  for (const int fd : slow) ::close(fd);
  ASSERT_TRUE(body) << "no answer, HTTP status " << status;
  std::printf("scrape answered in %.2f s with 200 idle and 20 slow connections held\n", took);
  std::string err;
  EXPECT_EQ(Value(ParseExposition(*body, &err), "exitscope_exit_duration_seconds_count",
                  {{"device", "nvme0"}, {"register", "SQ1TDBL"}}),
            1)
      << err;
}

TEST(MetricsExporter, CApiServesAndStops) {
  es_options opts;
  es_options_init(&opts);
  opts.num_vcpus = 1;
  opts.start_watchdog = 0;
  es_recorder* rec = nullptr;
  ASSERT_EQ(es_recorder_create(&opts, &rec), ES_OK) << es_last_error();
  uint32_t uart = 0;
  ASSERT_EQ(es_add_device(rec, "uart0", "uart16550", &uart), ES_OK);
  ASSERT_EQ(es_add_range_builtin(rec, ES_SPACE_PIO, 0x3f8, 8, uart, "uart16550"), ES_OK);
  for (int i = 0; i < 7; ++i) {
    ASSERT_EQ(es_begin_exit(rec, 0, ES_EXIT_PIO, 0x3f8, 1, ES_DIR_WRITE, 'x'), ES_OK);
    es_end_exit(rec, 0);
  }
  es_metrics* m = nullptr;
  EXPECT_EQ(es_serve_metrics(rec, "nonsense", &m), ES_EINVAL);
  EXPECT_NE(std::string(es_last_error()).find("nonsense"), std::string::npos);
  ASSERT_EQ(es_serve_metrics(rec, "127.0.0.1:0", &m), ES_OK) << es_last_error();
  const uint16_t port = es_metrics_port(m);
  ASSERT_NE(port, 0);
  std::string err;
  auto body = HttpGet("127.0.0.1", port, "/metrics");
  ASSERT_TRUE(body);
  const auto all = ParseExposition(*body, &err);
  EXPECT_EQ(Value(all, "exitscope_exit_duration_seconds_count",
                  {{"device", "uart0"}, {"register", "THR"}}),
            7);
  es_metrics_stop(m);
  EXPECT_FALSE(HttpGet("127.0.0.1", port, "/metrics")) << "still serving after es_metrics_stop";
  es_metrics_stop(nullptr);
  EXPECT_EQ(es_metrics_port(nullptr), 0);
  es_recorder_destroy(rec);
}

}  // namespace
}  // namespace exitscope
